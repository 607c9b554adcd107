"""No credential in a ``repr``/``str``: a config, the gateway's credentials and device
key, the providers' and LLM's keys, a call's bearer. Each would otherwise reach a log
line (``%s``/``%r``/an f-string), a traceback's locals, a debugger or a test's output."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, get_type_hints

import pytest

from xwm_bridge.adapters.agent_adapter import AdapterSettings
from xwm_bridge.config import BridgeConfig, ProviderConfig
from xwm_bridge.config.loading import load_config
from xwm_bridge.config.model import McpServerConfig
from xwm_bridge.config.secret_fields import _is_secret
from xwm_bridge.config.sections import AgentsConfig, StoreConfig
from xwm_bridge.core.context import CallContext
from xwm_bridge.core.params import SessionParams
from xwm_bridge.gateway import protocol as p
from xwm_bridge.gateway.connect_config import ConnectConfig
from xwm_bridge.jsonrpc import Request
from xwm_bridge.llm import ChatRequest
from xwm_bridge.providers.stdio.agent import AgentSpec
from xwm_bridge.providers.stdio.auth import AuthPlan
from xwm_bridge.providers.stdio.launch import AgentEnv
from xwm_bridge.router.classifier import Endpoint
from xwm_bridge.router.resolver import RoutingRequest

log = logging.getLogger("tests.secret_reprs")


def shown(obj: object, caplog: pytest.LogCaptureFixture) -> list[str]:
    """Every way an object commonly becomes text: repr, str, f-strings, log lines."""
    with caplog.at_level(logging.INFO, logger=log.name):
        log.info("with %s", obj)
        log.info("with %r", obj)
        log.info(f"an f-string {obj} {obj!r}")  # what careless code does
    lines = [r.getMessage() for r in caplog.records if r.name == log.name]
    caplog.clear()
    return [repr(obj), str(obj), f"{obj}", f"{obj!r}", *lines]


def assert_hidden(obj: object, secrets: list[str], caplog: pytest.LogCaptureFixture) -> None:
    assert secrets and all(secrets)
    for text in shown(obj, caplog):
        leaked = [s for s in secrets if s in text]
        assert not leaked, f"{leaked} in {text}"


def filled(obj: Any, prefix: str = "cfg") -> Any:
    """``obj`` with every ``Secret`` field, nested sections and providers included, set
    to a value naming it (a field added later is covered without naming it here)."""
    hints = get_type_hints(type(obj), include_extras=True)
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        name = f"{prefix}-{f.name}-sekrit"
        if _is_secret(hints[f.name]):
            changes[f.name] = (name, f"{name}-2") if isinstance(value, tuple) else name
        elif dataclasses.is_dataclass(value):
            changes[f.name] = filled(value, f"{prefix}.{f.name}")
        elif isinstance(value, tuple) and value and dataclasses.is_dataclass(value[0]):
            changes[f.name] = tuple(filled(v, f"{prefix}.{f.name}{i}") for i, v in enumerate(value))
    return dataclasses.replace(obj, **changes)


def secret_config() -> BridgeConfig:
    mcp = McpServerConfig(
        "m",
        type="http",
        url="https://mcp-user:mcp-url-sekrit@mcp.example/x",
        env=("MCP_TOKEN=mcp-env-sekrit",),
        headers=("Authorization: Bearer mcp-header-sekrit",),
    )
    provider = ProviderConfig(
        "agent",
        kind="stdio",
        command=("agent",),
        env=("OPENAI_API_KEY=provider-env-sekrit", "ANY_NAME=provider-plain-sekrit"),
        mcp_servers=(mcp,),
    )
    return filled(
        BridgeConfig(
            providers=(provider, ProviderConfig("http", endpoint="https://up.example")),
            agents=AgentsConfig(toolbridge_env=("VAULT_TOKEN=toolbridge-env-sekrit",)),
            store=StoreConfig(redis_url="redis://:redis-url-sekrit@127.0.0.1:6379/0"),
        )
    )


def test_a_config_shows_none_of_its_secrets(caplog: pytest.LogCaptureFixture) -> None:
    cfg = secret_config()
    secrets = [s for s in cfg.secrets() if "sekrit" in s]
    # every Secret field was filled, and the env/header/URL ones are in it too
    assert len(secrets) >= 20 and "redis-url-sekrit" in secrets
    assert "provider-plain-sekrit" in secrets and "mcp-header-sekrit" in secrets
    assert_hidden(cfg, secrets, caplog)
    for part in (cfg.providers[0], cfg.providers[0].mcp_servers[0], cfg.store, cfg.router):
        assert_hidden(part, [s for s in secrets if s in str(dataclasses.astuple(part))], caplog)
    text = repr(cfg)
    # still a useful repr: what is set and where, with the values masked
    assert "auth_token='***'" in text and "OPENAI_API_KEY=***" in text
    assert "redis://:***@127.0.0.1:6379/0" in text and "'Authorization: ***'" in text
    assert "endpoint='https://up.example'" in text


def test_a_loaded_config_shows_none_of_its_secrets(caplog: pytest.LogCaptureFixture) -> None:
    loaded = load_config(
        env={"ACP_AUTH_TOKEN": "env-token-sekrit", "OPENCLAW_TOKEN": "env-openclaw-sekrit"}
    )
    assert loaded.config.auth_token == "env-token-sekrit"
    assert_hidden(loaded, ["env-token-sekrit", "env-openclaw-sekrit"], caplog)


def test_gateway_credentials_and_device_key_are_not_shown(
    caplog: pytest.LogCaptureFixture,
) -> None:
    creds = p.Credentials(token="gw-token", device_token="gw-device-token", password="gw-pass")
    identity = p.Identity("device-1", "public-key-ok", "gw-private-key")
    assert_hidden(creds, ["gw-token", "gw-device-token", "gw-pass"], caplog)
    assert_hidden(identity, ["gw-private-key"], caplog)
    assert "device-1" in repr(identity)  # not secret: still shown
    cfg = ConnectConfig(
        url="wss://user:gw-url-pass@gw.example/?token=gw-url-token",
        remote_address="gw.example:443",
        mode="remote",
        client=p.ClientInfo(),
        identity=identity,
        creds=creds,
    )
    secrets = ["gw-token", "gw-device-token", "gw-pass", "gw-private-key", "gw-url-pass"]
    assert_hidden(cfg, [*secrets, "gw-url-token"], caplog)
    hello = p.parse_hello({"protocol": 3, "auth": {"deviceToken": "hello-device-token"}})
    assert hello.device_token == "hello-device-token"
    assert_hidden(hello, ["hello-device-token"], caplog)


def others() -> list[tuple[object, str]]:
    return [
        (ChatRequest("https://llm.example/v1", "llm-key", "m", [], 1.0), "llm-key"),
        (Endpoint("https://llm.example/v1", "endpoint-key"), "endpoint-key"),
        (RoutingRequest(gateway_api_key="routing-key"), "routing-key"),
        (CallContext(None, "http", principal="bearer:ab", bearer="call-bearer"), "call-bearer"),
        (AdapterSettings(auth_token="adapter-token"), "adapter-token"),
        (AgentSpec("a", ("a",), {"OPENAI_API_KEY": "spec-env-key"}, "/", {}), "spec-env-key"),
        (AgentEnv({"GEMINI_API_KEY": "agent-env-key"}), "agent-env-key"),
        (AuthPlan("api-key", {"_meta": {"api-key": "auth-plan-key"}}), "auth-plan-key"),
        (Request("session.start", {"apiKey": "rpc-params-key"}, 1), "rpc-params-key"),
        (
            SessionParams.parse({"sessionId": "s", "taskPrompt": "t", "apiKey": "raw-key"}),
            "raw-key",
        ),
    ]


@pytest.mark.parametrize("case", range(len(others())), ids=[type(o).__name__ for o, _ in others()])
def test_keys_and_bearers_elsewhere_are_not_shown(
    case: int, caplog: pytest.LogCaptureFixture
) -> None:
    obj, secret = others()[case]
    assert_hidden(obj, [secret], caplog)
