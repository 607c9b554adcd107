"""Every secret masked in the operator's config view (doctor and the console)."""

from __future__ import annotations

import orjson

from xwm_bridge.config import load_config
from xwm_bridge.config_view import MASK, masked


def test_every_secret_is_masked(tmp_path) -> None:  # type: ignore[no-untyped-def]
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(
        "providers:\n"
        "  - {id: agent, kind: stdio, command: [x], env: ['OPENAI_API_KEY=sk-live-123456']}\n"
        "  - {id: up, endpoint: 'http://127.0.0.1:9/acp/rpc',"
        " auth_header: 'Bearer prov-secret-1'}\n"
        "store: {redis_url: 'redis://:redis-pass-99@127.0.0.1:6379/0'}\n"
        "client_tokens: [client-token-77]\n"
        "openclaw_token: claw-secret-55\n"
        "public_base_url: 'https://x.example/?k=tok-abcdef-1'\n"
    )
    env = {
        "ACP_AUTH_TOKEN": "tok-abcdef-1",
        "INTERNAL_SERVICE_TOKEN": "internal-9876",
        "LLM_API_KEY": "llm-key-4321",
        "VAULT_SERVER_ROOT_ACCESS_TOKEN": "vault-root-1111",
        "XWM_MULTI_AGENT_API_KEY": "multi-key-2222",
    }
    cfg = load_config(config_file=str(cfg_file), env=env).config
    view = masked(cfg)
    text = orjson.dumps(view).decode()
    for secret in (
        "tok-abcdef-1", "internal-9876", "llm-key-4321", "vault-root-1111", "multi-key-2222",
        "sk-live-123456", "prov-secret-1", "redis-pass-99", "client-token-77", "claw-secret-55",
    ):  # fmt: skip
        assert secret not in text, secret
    assert view["auth_token"] == MASK and view["client_tokens"] == [MASK]
    assert view["providers"][0]["env"] == [f"OPENAI_API_KEY={MASK}"]
    assert view["store"]["redis_url"] == f"redis://:{MASK}@127.0.0.1:6379/0"
    assert view["public_base_url"] == MASK  # a value containing a secret
    assert view["listen"] == "127.0.0.1:8787"  # the rest stays readable


def test_query_and_flag_credentials_are_masked_in_place(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A key in a URL's query or an argv's flag is masked where it stands; the rest of
    the URL or argv stays readable."""
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(
        "providers:\n"
        "  - {id: up, endpoint: 'https://up.example/acp?api_key=q-sekrit-1&mode=fast'}\n"
        "  - id: a\n"
        "    kind: stdio\n"
        "    command: [agent, --api-key, flag-sekrit-2, --token=eq-sekrit-3]\n"
    )
    view = masked(load_config(config_file=str(cfg_file), env={}).config)
    assert view["providers"][0]["endpoint"] == f"https://up.example/acp?api_key={MASK}&mode=fast"
    assert view["providers"][1]["command"] == ["agent", "--api-key", MASK, f"--token={MASK}"]
