"""Principals: several client tokens, each its own owner of gateway runtimes."""

from __future__ import annotations

from xwm_bridge.config import load_config
from xwm_bridge.transport.security import BearerAuth, principal_of


def test_several_client_tokens_are_accepted() -> None:
    auth = BearerAuth("main-token", ("alice-token", "bob-token"))
    assert auth.check("Bearer main-token")
    assert auth.check("Bearer alice-token")
    assert auth.check("bob-token")
    assert not auth.check("Bearer mallory")
    assert not auth.check("")


def test_only_extra_tokens_still_require_one_of_them() -> None:
    auth = BearerAuth("", ("alice-token",))
    assert auth.check("Bearer alice-token")
    assert not auth.check("Bearer anything")


def test_principal_is_a_digest_of_the_credential() -> None:
    alice, cred = principal_of("Bearer alice-token")
    assert cred == "alice-token"
    assert alice.startswith("bearer:") and "alice" not in alice
    assert principal_of("alice-token")[0] == alice
    assert principal_of("bearer   alice-token ")[0] == alice
    assert principal_of("Bearer bob-token")[0] != alice
    assert principal_of(None) == ("anonymous", "")


def test_client_tokens_from_env_are_secrets() -> None:
    cfg = load_config(env={"XWM_CLIENT_TOKENS": "alice-token, bob-token"}).config
    assert cfg.client_tokens == ("alice-token", "bob-token")
    assert {"alice-token", "bob-token"} <= set(cfg.secrets())
