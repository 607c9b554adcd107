"""xwm_bridge.config.load_config: defaults < YAML < env < flags, validation, secrets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from xwm_bridge.config import (
    DEFAULT_ALLOWED_ORIGINS,
    BridgeConfig,
    ConfigError,
    LoadedConfig,
    ProviderConfig,
    load_config,
    provider_env_var,
)


def load(
    tmp_path: Path | None = None,
    yaml_text: str | None = None,
    *,
    env: dict[str, str] | None = None,
    flags: dict[str, Any] | None = None,
) -> LoadedConfig:
    config_file = None
    if yaml_text is not None:
        assert tmp_path is not None
        path = tmp_path / "bridge.yaml"
        path.write_text(yaml_text)
        config_file = str(path)
    return load_config(config_file=config_file, env=env or {}, flags=flags)


def config_error(tmp_path: Path | None, yaml_text: str | None = None, **kw: Any) -> str:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, yaml_text, **kw)
    return str(info.value)


# --- defaults -------------------------------------------------------------------------


def test_defaults() -> None:
    loaded = load()
    cfg = loaded.config
    assert cfg.listen == "127.0.0.1:8787"
    assert cfg.allowed_origins == (
        "https://xworkmate.svc.plus",
        "http://localhost:*",
        "http://127.0.0.1:*",
    )
    assert cfg.allowed_origins == DEFAULT_ALLOWED_ORIGINS
    assert cfg.auth_token == ""
    assert cfg.allow_unauthenticated is False
    assert cfg.multi_agent_enabled is True
    assert cfg.multi_agent_model == "gpt-4o"
    assert cfg.routing_model == "gpt-4o"
    assert cfg.public_base_url == "https://xworkmate-bridge.svc.plus"
    assert cfg.accounts_base_url == "https://accounts.svc.plus"
    assert cfg.openclaw_url == "wss://openclaw.svc.plus:443"
    assert cfg.allowed_roots == ()
    assert cfg.log_level == "info"
    assert cfg.limits.max_queue_depth == 32
    assert cfg.limits.artifact_max_files == 24
    assert cfg.limits.artifact_max_file_bytes == 2 * 1024 * 1024
    assert cfg.upstream_authorization == ""
    assert set(loaded.sources.values()) == {"default"}
    assert "listen" in loaded.sources and "providers" in loaded.sources


def test_default_provider_catalog() -> None:
    cfg = load().config
    assert [(p.id, p.label, p.endpoint) for p in cfg.providers] == [
        ("codex", "Codex", "https://acp-server.svc.plus/codex/acp/rpc"),
        ("opencode", "OpenCode", "https://acp-server.svc.plus/opencode/acp/rpc"),
        ("gemini", "Gemini", "https://acp-server.svc.plus/gemini/acp/rpc"),
    ]
    assert all(p.enabled and p.available and p.auth_header is None for p in cfg.providers)
    assert [p.id for p in cfg.available_providers] == ["codex", "opencode", "gemini"]


def test_provider_availability() -> None:
    assert not ProviderConfig("x", endpoint="http://h", enabled=False).available
    assert not ProviderConfig("x", endpoint="   ").available
    assert ProviderConfig("x", endpoint="http://h").available


def test_config_is_frozen() -> None:
    cfg = load().config
    with pytest.raises(AttributeError):
        cfg.listen = "0.0.0.0:1"  # type: ignore[misc]


# --- precedence -----------------------------------------------------------------------


def test_yaml_overrides_defaults(tmp_path: Path) -> None:
    loaded = load(
        tmp_path,
        "listen: 0.0.0.0:9000\nlog_level: debug\nlimits:\n  max_queue_depth: 4\n",
    )
    assert loaded.config.listen == "0.0.0.0:9000"
    assert loaded.config.log_level == "debug"
    assert loaded.config.limits.max_queue_depth == 4
    assert loaded.config.limits.max_body_bytes == 4 * 1024 * 1024  # untouched default
    assert loaded.sources["listen"] == "file"
    assert loaded.sources["limits"] == "file"
    assert loaded.sources["auth_token"] == "default"


def test_env_overrides_yaml(tmp_path: Path) -> None:
    loaded = load(
        tmp_path,
        "listen: 0.0.0.0:9000\nauth_token: from-file\n",
        env={"ACP_LISTEN_ADDR": "127.0.0.1:9100"},
    )
    assert loaded.config.listen == "127.0.0.1:9100"
    assert loaded.sources["listen"] == "env:ACP_LISTEN_ADDR"
    assert loaded.config.auth_token == "from-file"
    assert loaded.sources["auth_token"] == "file"


def test_flags_override_env(tmp_path: Path) -> None:
    loaded = load(
        tmp_path,
        "listen: 0.0.0.0:9000\n",
        env={"ACP_LISTEN_ADDR": "127.0.0.1:9100", "XWM_LOG_LEVEL": "warning"},
        flags={"listen": "127.0.0.1:9200", "log_level": None},
    )
    assert loaded.config.listen == "127.0.0.1:9200"
    assert loaded.sources["listen"] == "flag"
    # a None flag means "not given"
    assert loaded.config.log_level == "warning"
    assert loaded.sources["log_level"] == "env:XWM_LOG_LEVEL"


def test_flag_allow_unauthenticated() -> None:
    loaded = load(flags={"allow_unauthenticated": True})
    assert loaded.config.allow_unauthenticated is True
    assert loaded.sources["allow_unauthenticated"] == "flag"


def test_unknown_flag_key_rejected() -> None:
    assert config_error(None, flags={"bogus": 1}) == "bogus: unknown key"


def test_config_file_from_env_variable(tmp_path: Path) -> None:
    path = tmp_path / "other.yaml"
    path.write_text("listen: 127.0.0.1:9999\n")
    loaded = load_config(env={"XWM_BRIDGE_CONFIG": str(path)})
    assert loaded.config.listen == "127.0.0.1:9999"
    assert loaded.sources["listen"] == "file"


def test_explicit_config_file_wins_over_env_variable(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("listen: 127.0.0.1:1111\n")
    (tmp_path / "b.yaml").write_text("listen: 127.0.0.1:2222\n")
    loaded = load_config(
        config_file=str(tmp_path / "a.yaml"), env={"XWM_BRIDGE_CONFIG": str(tmp_path / "b.yaml")}
    )
    assert loaded.config.listen == "127.0.0.1:1111"


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(config_file=str(tmp_path / "nope.yaml"), env={})


def test_config_file_not_utf8_is_a_config_error(tmp_path: Path) -> None:
    """A Latin-1 file raised UnicodeDecodeError (a traceback, exit 1), not a config error."""
    path = tmp_path / "latin1.yaml"
    path.write_bytes("log_level: d\xe9bug\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"latin1\.yaml: not UTF-8 text \(byte 12\)"):
        load_config(config_file=str(path), env={})


@pytest.mark.parametrize(
    "text",
    ["providers: &a [*a]\n", "providers: " + "[" * 5000 + "]" * 5000 + "\n"],
    ids=["recursive-alias", "deep-nesting"],
)
def test_self_referencing_or_too_deep_yaml_is_a_config_error(tmp_path: Path, text: str) -> None:
    """Both raised RecursionError: a traceback with exit 1, not a config error."""
    message = config_error(tmp_path, text)
    assert "bridge.yaml: nested too deeply or refers to itself" in message


@pytest.mark.parametrize(
    ("text", "where"),
    [
        (
            "limits: {max_queue_depth: 3}\nlisten: 127.0.0.1:1\nlimits: {max_body_bytes: 5}\n",
            "duplicate key 'limits' (line 3, column 1)",
        ),
        ("providers:\n  - {id: a, label: A, label: B}\n", "duplicate key 'label' (line 2"),
    ],
)
def test_a_key_written_twice_is_a_config_error(tmp_path: Path, text: str, where: str) -> None:
    """YAML keeps the last: the first limits block was dropped without a word."""
    message = config_error(tmp_path, text)
    assert message.startswith(f"config file {tmp_path / 'bridge.yaml'}: {where}"), message


def test_a_merge_key_may_be_overridden(tmp_path: Path) -> None:
    text = "providers:\n  - &p {id: a, endpoint: 'http://x/acp/rpc'}\n  - {<<: *p, id: b}\n"
    assert [p.id for p in load(tmp_path, text).config.providers] == ["a", "b"]


@pytest.mark.parametrize("text", ["", "# only a comment\n", "---\n"])
def test_empty_yaml_is_defaults(tmp_path: Path, text: str) -> None:
    assert load(tmp_path, text).config == BridgeConfig()


def test_env_does_not_leak_from_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACP_LISTEN_ADDR", "127.0.0.1:4444")
    assert load(env={}).config.listen == "127.0.0.1:8787"
    assert load_config(env=None).config.listen == "127.0.0.1:4444"


# --- environment variables ------------------------------------------------------------


def test_env_mapping() -> None:
    env = {
        "ACP_AUTH_TOKEN": " tok ",
        "INTERNAL_SERVICE_TOKEN": "ist",
        "BRIDGE_AUTH_TOKEN": "bat",
        "ACP_MULTI_AGENT_ENABLED": "off",
        "ACP_MULTI_AGENT_MODEL": "m1",
        "ACP_ROUTING_MODEL": "m2",
        "IMAGE": "ghcr.io/x/y:1",
        "BRIDGE_PUBLIC_BASE_URL": "https://pub.example",
        "ACCOUNTS_BASE_URL": "https://acc.example",
        "XWM_OPENCLAW_URL": "wss://claw.example",
        "XWM_LOG_LEVEL": "error",
    }
    loaded = load(env=env)
    cfg = loaded.config
    assert cfg.auth_token == "tok"
    assert cfg.internal_service_token == "ist"
    assert cfg.bridge_auth_token == "bat"
    assert cfg.multi_agent_enabled is False
    assert cfg.multi_agent_model == "m1"
    assert cfg.routing_model == "m2"
    assert cfg.image == "ghcr.io/x/y:1"
    assert cfg.public_base_url == "https://pub.example"
    assert cfg.accounts_base_url == "https://acc.example"
    assert cfg.openclaw_url == "wss://claw.example"
    assert cfg.log_level == "error"
    assert loaded.sources["auth_token"] == "env:ACP_AUTH_TOKEN"
    assert loaded.sources["multi_agent_enabled"] == "env:ACP_MULTI_AGENT_ENABLED"


@pytest.mark.parametrize("value", ["", "   ", "\t\n"])
def test_blank_env_is_unset(tmp_path: Path, value: str) -> None:
    loaded = load(
        tmp_path,
        "auth_token: from-file\n",
        env={"ACP_AUTH_TOKEN": value, "ACP_LISTEN_ADDR": value, "ACP_ALLOWED_ORIGINS": value},
    )
    assert loaded.config.auth_token == "from-file"
    assert loaded.sources["auth_token"] == "file"
    assert loaded.config.listen == "127.0.0.1:8787"
    assert loaded.sources["listen"] == "default"
    assert loaded.config.allowed_origins == DEFAULT_ALLOWED_ORIGINS


def test_allowed_origins_comma_split() -> None:
    cfg = load(env={"ACP_ALLOWED_ORIGINS": " https://a.example , ,http://b:*,, "}).config
    assert cfg.allowed_origins == ("https://a.example", "http://b:*")


@pytest.mark.parametrize(
    "entry", ["localhost:3000", "*", "null", "http://:3000", "https://a:99999"]
)
def test_an_origin_entry_that_allows_nothing_is_a_config_error(entry: str) -> None:
    """The allow-list dropped it without a word: ``localhost:3000`` (no scheme) or
    ``*`` and every browser client got 403 with the entry seemingly there."""
    env = {"ACP_ALLOWED_ORIGINS": f"https://ok.example, {entry}"}
    message = config_error(None, env=env)
    assert message == (
        f"allowed_origins[1]: expected scheme://host[:port] or scheme://host:*, got {entry!r}"
    )


def test_an_origin_of_any_scheme_is_accepted() -> None:
    env = {"ACP_ALLOWED_ORIGINS": "tauri://localhost,http://127.0.0.1:*,https://[::1]:8443"}
    assert len(load(env=env).config.allowed_origins) == 3


@pytest.mark.parametrize(
    "section",
    ["gateway: {allowed_hosts", "multi_agent: {allowed_hosts", "router: {classifier_allowed_hosts"],
)
@pytest.mark.parametrize(
    "entry", ["https://gw.example", "gw.example:abc", "[::1]:x", "gw:99999", "u@h"]
)
def test_a_dial_allow_list_entry_that_matches_nothing_is_a_config_error(
    tmp_path: Path, section: str, entry: str
) -> None:
    """A URL (``https://gw.example``) or a port that is no number was kept whole: it
    allowed no host, and as the list was set, loopback and the configured endpoints
    were no longer allowed either."""
    message = config_error(tmp_path, f"{section}: ['gw.example:443', {entry!r}]}}\n")
    name = section.split("{", 1)[0].rstrip(": ")
    key = section.split("{", 1)[1]
    assert message == (
        f"{name}.{key}[1]: expected host, host:port, [IPv6]:port or *, got {entry!r}"
    ), message


def test_dial_allow_list_entries_of_every_form_are_accepted(tmp_path: Path) -> None:
    entries = "['*', gw.example, 'gw.example:443', '::1', '[::1]', '[::1]:8080', '10.0.0.1:80']"
    cfg = load(tmp_path, f"gateway: {{allowed_hosts: {entries}}}\n").config
    assert len(cfg.gateway.allowed_hosts) == 7


def test_allowed_hosts_comma_split_and_checked(tmp_path: Path) -> None:
    assert load().config.allowed_hosts == ()
    cfg = load(env={"XWM_ALLOWED_HOSTS": " bridge.lan , ,*,, "}).config
    assert cfg.allowed_hosts == ("bridge.lan", "*")
    for bad in ("'http://bridge.lan'", "'a b'", "'user@host'"):
        with pytest.raises(ConfigError, match=r"allowed_hosts\[0\]: expected a host name"):
            load(tmp_path, f"allowed_hosts: [{bad}]\n")


def test_allowed_roots_colon_split(tmp_path: Path) -> None:
    loaded = load(env={"XWM_ALLOWED_ROOTS": f" {tmp_path}/a : :/srv/b:"})
    assert loaded.config.allowed_roots == (f"{tmp_path}/a", "/srv/b")
    assert loaded.sources["allowed_roots"] == "env:XWM_ALLOWED_ROOTS"


def test_relative_allowed_root_rejected() -> None:
    message = config_error(None, env={"XWM_ALLOWED_ROOTS": "/ok:relative/dir"})
    assert message.startswith("allowed_roots[1]:")
    assert "absolute" in message


def test_relative_allowed_root_in_yaml_rejected(tmp_path: Path) -> None:
    message = config_error(tmp_path, "allowed_roots: [./here]\n")
    assert message.startswith("allowed_roots[0]:")


@pytest.mark.parametrize(
    "url",
    [
        "openclaw.internal:18789",  # no scheme: was dialed as "gateway connection failed" forever
        "https://openclaw.internal",  # not a WebSocket URL: the same
        "wss://openclaw.internal:99999",  # an openclaw connect answered -32603 internal error
        "wss://:443",
    ],
)
def test_openclaw_url_must_be_a_websocket_url(url: str) -> None:
    message = config_error(None, env={"XWM_OPENCLAW_URL": url})
    assert message.startswith("openclaw_url:"), message
    assert load(env={"XWM_OPENCLAW_URL": "ws://127.0.0.1:18789/gw"}).config.openclaw_url


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("localhost:6379", "expected redis://host"),  # redis-py: ValueError at start
        ("redis://:pw-77@[::1/0", "Invalid IPv6 URL"),  # urlsplit: a traceback
        ("redis://:pw-77@127.0.0.1:99999/0", "Port out of range"),
        ("redis://:pw-77@h:6379/zero", "the path is the database number"),
        ("redis:///0", "no host"),
        ("unix://", "needs the socket's path"),
    ],
)
def test_a_malformed_redis_url_is_a_config_error_without_its_password(
    url: str, problem: str
) -> None:
    """serve and doctor ended in a traceback; doctor --offline called it valid."""
    message = config_error(None, env={"XWM_REDIS_URL": url, "XWM_SESSION_STORE": "redis"})
    assert message.startswith("store.redis_url: ") and problem in message, message
    assert "pw-77" not in message


@pytest.mark.parametrize(
    "url", ["redis://h:6379/0", "rediss://u:p@h", "redis://[::1]:6379/2", "unix:///run/r.sock"]
)
def test_a_redis_url_redis_py_takes_is_accepted(url: str) -> None:
    assert load(env={"XWM_REDIS_URL": url}).config.store.redis_url == url


def test_provider_url_env_override() -> None:
    loaded = load(env={"XWM_PROVIDER_CODEX_URL": " http://127.0.0.1:9010 "})
    codex = loaded.config.providers[0]
    assert codex.id == "codex"
    assert codex.endpoint == "http://127.0.0.1:9010"
    assert loaded.sources["providers[0].endpoint"] == "env:XWM_PROVIDER_CODEX_URL"
    assert loaded.config.providers[1].endpoint == "https://acp-server.svc.plus/opencode/acp/rpc"
    assert "providers[1].endpoint" not in loaded.sources


def test_provider_url_env_applies_to_yaml_providers(tmp_path: Path) -> None:
    loaded = load(
        tmp_path,
        "providers:\n  - id: my-agent.v2\n    endpoint: http://a\n",
        env={"XWM_PROVIDER_MY_AGENT_V2_URL": "ws://b:1/acp"},
    )
    assert loaded.config.providers[0].endpoint == "ws://b:1/acp"


def test_provider_env_var_name() -> None:
    assert provider_env_var("codex") == "XWM_PROVIDER_CODEX_URL"
    assert provider_env_var("my-agent.v2") == "XWM_PROVIDER_MY_AGENT_V2_URL"


def test_provider_url_env_with_bad_scheme_rejected() -> None:
    message = config_error(None, env={"XWM_PROVIDER_GEMINI_URL": "ftp://x/y"})
    assert message == "providers[2].endpoint: unsupported external ACP scheme: ftp"


@pytest.mark.parametrize(
    ("value", "expected"), [("maybe", True), ("off", False), ("0", False), ("YES", True)]
)
def test_env_bool_follows_the_flag_rule(value: str, expected: bool) -> None:
    # config.md §2.1: ACP_MULTI_AGENT_ENABLED unrecognized → the default (true)
    cfg = load_config(env={"ACP_MULTI_AGENT_ENABLED": value}).config
    assert cfg.multi_agent_enabled is expected


def test_bad_listen_rejected() -> None:
    assert config_error(None, env={"ACP_LISTEN_ADDR": "nohost"}).startswith("listen:")
    assert config_error(None, flags={"listen": "h:99999"}).startswith("listen:")


def test_bad_log_level_rejected() -> None:
    assert config_error(None, flags={"log_level": "loud"}).startswith("log_level:")


# --- upstream authorization and secrets -----------------------------------------------


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, ""),
        ({"BRIDGE_AUTH_TOKEN": "bat"}, "Bearer bat"),
        ({"INTERNAL_SERVICE_TOKEN": "ist"}, "Bearer ist"),
        ({"INTERNAL_SERVICE_TOKEN": "ist", "BRIDGE_AUTH_TOKEN": "bat"}, "Bearer ist"),
        ({"INTERNAL_SERVICE_TOKEN": " ", "BRIDGE_AUTH_TOKEN": "bat"}, "Bearer bat"),
        ({"INTERNAL_SERVICE_TOKEN": "Token abc"}, "Token abc"),
        ({"INTERNAL_SERVICE_TOKEN": "Bearer xyz"}, "Bearer xyz"),
        ({"BRIDGE_AUTH_TOKEN": "  spaced  "}, "Bearer spaced"),
    ],
)
def test_upstream_authorization(env: dict[str, str], expected: str) -> None:
    assert load(env=env).config.upstream_authorization == expected


def test_provider_authorization(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        "providers:\n"
        "  - {id: a, endpoint: 'http://a'}\n"
        "  - {id: b, endpoint: 'http://b', auth_header: 'Basic zzzz'}\n"
        "  - {id: c, endpoint: 'http://c', auth_header: ''}\n",
        env={"INTERNAL_SERVICE_TOKEN": "ist"},
    ).config
    a, b, c = cfg.providers
    assert cfg.provider_authorization(a) == "Bearer ist"
    assert cfg.provider_authorization(b) == "Basic zzzz"
    assert cfg.provider_authorization(c) == ""


def test_secrets_contain_configured_tokens(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        "providers:\n  - {id: a, endpoint: 'http://a', auth_header: 'Bearer provider-secret'}\n",
        env={
            "ACP_AUTH_TOKEN": "client-token",
            "INTERNAL_SERVICE_TOKEN": "service-token",
            "BRIDGE_AUTH_TOKEN": "Bearer bridge-token",
        },
    ).config
    secrets = cfg.secrets()
    for value in (
        "client-token",
        "service-token",
        "Bearer bridge-token",
        "bridge-token",
        "Bearer provider-secret",
        "provider-secret",
    ):
        assert value in secrets
    assert "" not in secrets


def test_secrets_skip_empty_values_but_keep_short_ones() -> None:
    """issue 16 item 11: a configured secret is masked whatever its length."""
    assert load().config.secrets() == ()
    assert load(env={"ACP_AUTH_TOKEN": "abc"}).config.secrets() == ("abc",)
    assert load(env={"INTERNAL_SERVICE_TOKEN": "Bearer x"}).config.secrets() == ("Bearer x", "x")


def test_secrets_come_from_every_secret_typed_field_and_url_passwords(tmp_path: Path) -> None:
    yaml_text = (
        "client_tokens: [c1, c2]\n"
        "admin_tokens: [adm]\n"
        "openclaw_token: oc\n"
        "multi_agent: {api_key: ma}\n"
        "router: {llm_api_key: rk}\n"
        "toolbridge: {llm_api_key: tk, vault_token: vt}\n"
        "store: {redis_url: 'redis://:rpass@h:6379/0'}\n"
        "providers:\n"
        "  - {id: a, endpoint: 'https://u:ppass@a.example/acp/rpc'}\n"
        "  - {id: b, kind: stdio, command: [x],\n"
        "     env: [OPENAI_API_KEY=k1, MODE=abc, LONG=abcdefghij]}\n"
    )
    secrets = set(load(tmp_path, yaml_text).config.secrets())
    expected = {"c1", "c2", "adm", "oc", "ma", "rk", "tk", "vt", "rpass", "ppass", "k1"}
    assert expected <= secrets
    assert "abcdefghij" in secrets  # env values from 4 characters count as secrets
    assert "abc" not in secrets  # a shorter value of a plain-named variable does not


# --- interpolation --------------------------------------------------------------------


def test_interpolation(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        "listen: ${HOST}:${PORT}\n"
        "auth_token: ${TOKEN:-fallback-token}\n"
        "image: 'img-${TAG:-latest}'\n"
        "providers:\n  - id: a\n    endpoint: ${A_URL}\n",
        env={"HOST": "127.0.0.1", "PORT": "7001", "A_URL": "http://up:1"},
    ).config
    assert cfg.listen == "127.0.0.1:7001"
    assert cfg.auth_token == "fallback-token"
    assert cfg.image == "img-latest"
    assert cfg.providers[0].endpoint == "http://up:1"


def test_interpolation_default_used_for_blank_var(tmp_path: Path) -> None:
    cfg = load(tmp_path, "image: ${TAG:-latest}\n", env={"TAG": "  "}).config
    assert cfg.image == "latest"


def test_interpolation_empty_default(tmp_path: Path) -> None:
    assert load(tmp_path, "image: x${NOPE:-}y\n").config.image == "xy"


def test_interpolation_set_var_beats_default(tmp_path: Path) -> None:
    cfg = load(tmp_path, "image: ${TAG:-latest}\n", env={"TAG": "v2"}).config
    assert cfg.image == "v2"


def test_interpolation_is_not_recursive(tmp_path: Path) -> None:
    cfg = load(tmp_path, "image: ${A}\n", env={"A": "${B}", "B": "nope"}).config
    assert cfg.image == "${B}"


def test_interpolation_into_numbers(tmp_path: Path) -> None:
    cfg = load(tmp_path, "limits:\n  max_queue_depth: ${DEPTH}\n", env={"DEPTH": "5"}).config
    assert cfg.limits.max_queue_depth == 5


def test_missing_variable_names_the_key(tmp_path: Path) -> None:
    message = config_error(tmp_path, "limits:\n  bootstrap_timeout: ${NOT_SET_ANYWHERE}\n")
    assert message.startswith("limits.bootstrap_timeout:")
    assert "NOT_SET_ANYWHERE" in message


def test_missing_variable_in_list_names_the_index(tmp_path: Path) -> None:
    message = config_error(tmp_path, "providers:\n  - id: a\n    endpoint: ${NOPE}\n")
    assert message.startswith("providers[0].endpoint:")
    assert "NOPE" in message


def test_blank_variable_counts_as_missing(tmp_path: Path) -> None:
    message = config_error(tmp_path, "image: ${EMPTY}\n", env={"EMPTY": ""})
    assert message.startswith("image:")


# --- errors ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("yaml_text", "key"),
    [
        ("bogus: 1\n", "bogus"),
        ("limits:\n  nope: 1\n", "limits.nope"),
        ("providers:\n  - id: a\n    endpoint: http://a\n    colour: red\n", "providers[0].colour"),
    ],
)
def test_unknown_key_names_dotted_path(tmp_path: Path, yaml_text: str, key: str) -> None:
    assert config_error(tmp_path, yaml_text) == f"{key}: unknown key"


@pytest.mark.parametrize(
    ("yaml_text", "message"),
    [
        ("limts: {}\n", "limts: unknown key (did you mean limits?)"),
        ("store:\n  backnd: memory\n", "store.backnd: unknown key (did you mean backend?)"),
        ("agents:\n  sandbx: none\n", "agents.sandbx: unknown key (did you mean sandbox?)"),
    ],
)
def test_unknown_key_suggests_the_nearest_known_one(
    tmp_path: Path, yaml_text: str, message: str
) -> None:
    assert config_error(tmp_path, yaml_text) == message


@pytest.mark.parametrize(
    ("yaml_text", "prefix"),
    [
        ('limits:\n  max_queue_depth: "abc"\n', "limits.max_queue_depth:"),
        ("limits:\n  max_queue_depth: 1.5\n", "limits.max_queue_depth:"),
        ("limits:\n  max_queue_depth: true\n", "limits.max_queue_depth:"),
        ("limits:\n  max_queue_depth: -1\n", "limits.max_queue_depth:"),
        ("limits:\n  session_idle_ttl: .nan\n", "limits.session_idle_ttl:"),
        # an infinite wait is no timeout; store.retention: .inf dropped every Redis save
        ("limits:\n  shutdown_grace: .inf\n", "limits.shutdown_grace: must be finite"),
        ("store:\n  retention: .inf\n", "store.retention: must be finite"),
        ("limits:\n  max_queue_depth: [1]\n", "limits.max_queue_depth:"),
        ("limits: 5\n", "limits:"),
        ("providers:\n  - id: a\n    enabled: maybe\n", "providers[0].enabled:"),
        ("providers: codex\n", "providers[0]:"),
        ("providers: {id: a}\n", "providers:"),
        ("providers: 3\n", "providers:"),
        ("auth_token: {a: 1}\n", "auth_token:"),
        ("allowed_origins: {a: 1}\n", "allowed_origins:"),
        ("allow_unauthenticated: 2\n", "allow_unauthenticated:"),
        ("providers:\n  - endpoint: http://a\n", "providers[0]"),
        ("providers:\n  - id: ' '\n", "providers[0].id:"),
        ("providers:\n  - {id: a, endpoint: 'http://a', read_timeout: 0}\n", "providers[0]."),
    ],
)
def test_wrong_types_name_the_key(tmp_path: Path, yaml_text: str, prefix: str) -> None:
    assert config_error(tmp_path, yaml_text).startswith(prefix)


def test_bool_words_accepted(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        "multi_agent_enabled: 'no'\n"
        "allow_unauthenticated: 'on'\n"
        "providers:\n  - {id: a, endpoint: 'http://a', enabled: 0, stream: 'yes'}\n",
    ).config
    assert cfg.multi_agent_enabled is False
    assert cfg.allow_unauthenticated is True
    assert cfg.providers[0].enabled is False
    assert cfg.providers[0].stream is True
    assert cfg.available_providers == ()


def test_numbers_from_strings_and_integral_floats(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        "limits:\n  max_queue_depth: '7'\n  artifact_max_files: 3.0\n  session_idle_ttl: 5\n",
    ).config
    assert cfg.limits.max_queue_depth == 7
    assert cfg.limits.artifact_max_files == 3
    assert isinstance(cfg.limits.artifact_max_files, int)
    assert cfg.limits.session_idle_ttl == 5.0
    assert isinstance(cfg.limits.session_idle_ttl, float)


def test_yaml_lists_and_comma_strings(tmp_path: Path) -> None:
    cfg = load(tmp_path, "allowed_origins: 'https://a, https://b'\n").config
    assert cfg.allowed_origins == ("https://a", "https://b")
    cfg = load(tmp_path, "allowed_origins: [https://c]\n").config
    assert cfg.allowed_origins == ("https://c",)


def test_invalid_yaml_reports_line(tmp_path: Path) -> None:
    message = config_error(tmp_path, "listen: 127.0.0.1:1\nlimits:\n  a: [1, 2\n  b: 3\n")
    assert message.startswith("config file ")
    assert "line " in message
    assert "(line 4," in message or "(line 3," in message


def test_invalid_yaml_tab_indent_reports_line(tmp_path: Path) -> None:
    message = config_error(tmp_path, "limits:\n\tmax_queue_depth: 1\n")
    assert "(line 2, column 1)" in message


def test_top_level_not_a_mapping(tmp_path: Path) -> None:
    assert "top level must be a mapping" in config_error(tmp_path, "- a\n- b\n")


def test_duplicate_provider_ids_rejected(tmp_path: Path) -> None:
    message = config_error(
        tmp_path,
        "providers:\n  - {id: codex, endpoint: 'http://a'}\n  - {id: Codex, endpoint: 'http://b'}\n",
    )
    assert message.startswith("providers[1].id:")
    assert "duplicate" in message


@pytest.mark.parametrize(
    ("endpoint", "detail"),
    [
        ("ftp://host/x", "unsupported external ACP scheme: ftp"),
        ("file:///etc/passwd", "absolute URI"),
        ("not a url", "absolute URI"),
    ],
)
def test_bad_endpoint_rejected(tmp_path: Path, endpoint: str, detail: str) -> None:
    message = config_error(tmp_path, f"providers:\n  - {{id: a, endpoint: '{endpoint}'}}\n")
    assert message.startswith("providers[0].endpoint:")
    assert detail in message


def test_disabled_or_blank_endpoint_not_validated(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        "providers:\n  - {id: a, endpoint: 'ftp://x', enabled: false}\n  - {id: b, endpoint: ''}\n",
    ).config
    assert [p.available for p in cfg.providers] == [False, False]


def test_providers_replace_the_catalog(tmp_path: Path) -> None:
    cfg = load(tmp_path, "providers:\n  - {id: solo, label: Solo, endpoint: 'ws://h/acp'}\n").config
    assert [p.id for p in cfg.providers] == ["solo"]
    assert cfg.providers[0].label == "Solo"


def test_empty_providers_list(tmp_path: Path) -> None:
    assert load(tmp_path, "providers: []\n").config.providers == ()


def test_zero_size_limit_rejected(tmp_path: Path) -> None:
    assert config_error(tmp_path, "limits:\n  max_body_bytes: 0\n").startswith("limits")


@pytest.mark.parametrize(
    ("yaml_text", "key"),
    [
        ("client_tokens: ['']\n", "client_tokens[0]"),
        ("client_tokens: [good, '  ']\n", "client_tokens[1]"),
        ("client_tokens: ['${UNSET_XWM_TOKEN:-}']\n", "client_tokens[0]"),
        ("admin_tokens: ['']\n", "admin_tokens[0]"),
    ],
)
def test_blank_tokens_are_a_config_error(tmp_path: Path, yaml_text: str, key: str) -> None:
    """issue 16 item 5: a blank token used to switch authentication off."""
    assert config_error(tmp_path, yaml_text) == f"{key}: must not be blank"


def test_admin_tokens_from_env() -> None:
    cfg = load(env={"XWM_ADMIN_TOKENS": "a1, a2"}).config
    assert cfg.admin_tokens == ("a1", "a2") and cfg.authenticates


def test_credentials_are_the_narrow_set_masked_in_replies(tmp_path: Path) -> None:
    """Replies mask credentials only: a plain env value such as "http" must not become
    [REDACTED] in a client's answer; logs mask it all the same."""
    yaml_text = (
        "providers:\n"
        "  - {id: a, kind: stdio, command: [x], auth_api_key: ak,\n"
        "     env: [MY_TOKEN=t1, MODE=http, AGENT_AUTH=method-id]}\n"
    )
    cfg = load(tmp_path, yaml_text).config
    assert {"ak", "t1"} <= set(cfg.credentials())
    assert "http" not in cfg.credentials() and "method-id" not in cfg.credentials()
    assert {"ak", "t1", "http", "method-id"} <= set(cfg.secrets())


def test_an_empty_openclaw_url_is_no_gateway_not_a_config_error(tmp_path: Path) -> None:
    """``openclaw_url: ""`` in a YAML that has no OpenClaw gateway kept starting before
    the URL was validated; an openclaw connect then says the endpoint is missing."""
    path = tmp_path / "bridge.yaml"
    path.write_text('openclaw_url: ""\n')
    assert load_config(config_file=str(path), env={}).config.openclaw_url == ""


@pytest.mark.parametrize(
    ("var", "key", "default"),
    [
        ("ACP_MULTI_AGENT_ENABLED", "multi_agent_enabled", True),
        ("XWM_AGENTS_DETECT", "detect", True),
    ],
)
def test_a_boolean_variable_not_understood_is_warned_about_and_the_default_applies(
    var: str, key: str, default: bool
) -> None:
    """The spec's **flag** rule for every boolean variable, but never silently."""
    loaded = load(env={var: " Maybe "})
    config = loaded.config.agents if key == "detect" else loaded.config
    assert getattr(config, key) is default
    assert [(w.variable, w.value, w.default) for w in loaded.warnings] == [(var, "Maybe", default)]
    assert var in str(loaded.warnings[0]) and "Maybe" in str(loaded.warnings[0])


@pytest.mark.parametrize("var", ["ACP_MULTI_AGENT_ENABLED", "XWM_AGENTS_DETECT"])
@pytest.mark.parametrize(("word", "value"), [("0", False), ("OFF", False), ("yes", True)])
def test_a_boolean_variable_understood_warns_of_nothing(var: str, word: str, value: bool) -> None:
    loaded = load(env={var: word})
    config = loaded.config.agents if var == "XWM_AGENTS_DETECT" else loaded.config
    assert (config.detect if var == "XWM_AGENTS_DETECT" else config.multi_agent_enabled) is value
    assert loaded.warnings == ()


def test_the_value_of_a_secret_looking_variable_is_never_in_its_warning() -> None:
    from xwm_bridge.config.env_vars import env_flag

    value, warning = env_flag("SOME_API_TOKEN", "hunter2", False)
    assert value is False and warning is not None
    assert warning.value is None and "hunter2" not in str(warning)
    assert env_flag("SOME_API_TOKEN", "on", False) == (True, None)


def test_credentials_in_url_queries_and_command_flags_are_credentials(tmp_path: Path) -> None:
    """A key given as a URL's query parameter (``?api_key=…``) or as an agent's or MCP
    server's command-line flag (``--api-key …``, ``--token=…``) is as much a credential
    as one in ``env``: it was in no log redaction, client-reply masking or ``repr``."""
    yaml_text = (
        "providers:\n"
        "  - {id: up, endpoint: 'https://up.example/acp?api_key=q-sekrit&max_tokens=100'}\n"
        "  - id: a\n"
        "    kind: stdio\n"
        "    command: [agent, --api-key, flag-sekrit, --token=eq-sekrit, --max-tokens, '4096',\n"
        "              --oauth, 'yes']\n"
        "    mcp_servers:\n"
        "      - {name: m, command: srv, args: [--auth-token, mcp-sekrit, --verbose]}\n"
        "      - {name: h, type: http, url: 'https://mcp.example/?access_token=url-sekrit'}\n"
    )
    cfg = load(tmp_path, yaml_text).config
    found = {"q-sekrit", "flag-sekrit", "eq-sekrit", "mcp-sekrit", "url-sekrit"}
    assert found <= set(cfg.credentials())
    # a name that only holds the word is no credential: 4096 is not masked in replies
    assert not {"100", "4096", "--verbose", "agent", "srv"} & set(cfg.credentials())
    # nor is a short value under one (it would be masked in every reply)
    assert "yes" not in cfg.credentials()
    text = repr(cfg)
    assert not [s for s in found if s in text], text
    # still useful: what is set, with the values masked
    assert "https://up.example/acp?api_key=***&max_tokens=100" in text
    assert "'--api-key', '***', '--token=***', '--max-tokens', '4096'" in text


@pytest.mark.parametrize(
    ("server", "key"),
    [
        (
            "{name: m, type: http, url: 'http://x',"
            " headers: ['Ok: 1', Authorization Bearer sk-77]}",
            "headers[1]",
        ),
        ("{name: m, command: srv, env: [MODE=a, sk-77]}", "env[1]"),
    ],
)
def test_a_malformed_mcp_env_or_header_is_not_echoed(tmp_path: Path, server: str, key: str) -> None:
    """A header or env item missing its separator is most likely a bare credential
    (``Authorization Bearer sk-…``): the error line printed it, to stderr and journals."""
    yaml_text = f"providers:\n  - {{id: a, kind: stdio, command: [x], mcp_servers: [{server}]}}\n"
    message = config_error(tmp_path, yaml_text)
    assert message.startswith(f"providers[0].mcp_servers[0].{key}: expected"), message
    assert "sk-77" not in message


@pytest.mark.parametrize(
    ("text", "key", "read"),
    [
        ("auth_token: 0123\n", "auth_token", "a number"),  # YAML 1.1 octal: it was "83"
        ("client_tokens: [abcdefgh, 0x1F]\n", "client_tokens[1]", "a number"),  # "31"
        ("toolbridge: {llm_api_key: yes}\n", "toolbridge.llm_api_key", "a boolean"),  # "True"
        (
            "providers: [{id: a, endpoint: 'http://x/acp/rpc', auth_header: 1_000}]\n",
            "providers[0].auth_header",
            "a number",
        ),
    ],
)
def test_an_unquoted_credential_yaml_reads_as_a_number_is_a_config_error(
    tmp_path: Path, text: str, key: str, read: str
) -> None:
    """The token silently became another one (``0123`` → ``83``), masked everywhere, so
    clients got 401 with the right token and nobody could see why."""
    message = config_error(tmp_path, text)
    assert message == f"{key}: a credential must be a quoted string (YAML read {read})"


def test_a_quoted_numeric_credential_is_kept_as_written(tmp_path: Path) -> None:
    cfg = load(tmp_path, "auth_token: '0123'\nclient_tokens: ['0x1F']\n").config
    assert cfg.auth_token == "0123" and cfg.client_tokens == ("0x1F",)
    assert load(env={"ACP_AUTH_TOKEN": "0123"}).config.auth_token == "0123"
