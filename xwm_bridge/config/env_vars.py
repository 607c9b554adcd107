"""The environment variables the config reads (config.md §2.1), the one naming the
YAML file, and the bridge's own secret ones (never copied into an agent's)."""

from __future__ import annotations

import dataclasses
import re
import typing
from collections.abc import Iterable, Mapping

from xwm_bridge import coerce
from xwm_bridge.config.model import BridgeConfig

ENV_VARS: dict[str, str] = {
    "listen": "ACP_LISTEN_ADDR",
    "auth_token": "ACP_AUTH_TOKEN",
    "client_tokens": "XWM_CLIENT_TOKENS",
    "admin_tokens": "XWM_ADMIN_TOKENS",
    "allowed_origins": "ACP_ALLOWED_ORIGINS",
    "allowed_hosts": "XWM_ALLOWED_HOSTS",
    "internal_service_token": "INTERNAL_SERVICE_TOKEN",
    "bridge_auth_token": "BRIDGE_AUTH_TOKEN",
    "multi_agent_enabled": "ACP_MULTI_AGENT_ENABLED",
    "multi_agent_model": "ACP_MULTI_AGENT_MODEL",
    "routing_model": "ACP_ROUTING_MODEL",
    "image": "IMAGE",
    "public_base_url": "BRIDGE_PUBLIC_BASE_URL",
    "accounts_base_url": "ACCOUNTS_BASE_URL",
    "openclaw_url": "XWM_OPENCLAW_URL",
    "openclaw_token": "XWM_OPENCLAW_TOKEN",
    "allowed_roots": "XWM_ALLOWED_ROOTS",
    "log_level": "XWM_LOG_LEVEL",
    "log_format": "XWM_LOG_FORMAT",
}
#: nested keys set from the environment (config.md §2.3 for the toolbridge)
NESTED_ENV_VARS: dict[str, str] = {
    "toolbridge.llm_api_key": "LLM_API_KEY",
    "toolbridge.llm_base_url": "LLM_BASE_URL",
    "toolbridge.llm_model": "LLM_MODEL",
    "toolbridge.claude_bin": "CLAUDE_BIN",
    "toolbridge.claude_review_model": "CLAUDE_REVIEW_MODEL",
    "toolbridge.claude_review_system": "CLAUDE_REVIEW_SYSTEM",
    "toolbridge.claude_review_tools": "CLAUDE_REVIEW_TOOLS",
    "toolbridge.claude_review_timeout": "CLAUDE_REVIEW_TIMEOUT_SEC",
    "toolbridge.vault_url": "VAULT_SERVER_URL",
    "toolbridge.vault_token": "VAULT_SERVER_ROOT_ACCESS_TOKEN",
    "toolbridge.vault_namespace": "VAULT_NAMESPACE",
    "multi_agent.max_iterations": "XWM_MULTI_AGENT_MAX_ITERATIONS",
    "multi_agent.base_url": "XWM_MULTI_AGENT_BASE_URL",
    "multi_agent.api_key": "XWM_MULTI_AGENT_API_KEY",
    "router.llm_base_url": "LLM_BASE_URL",
    "router.llm_api_key": "LLM_API_KEY",
    "router.find_skills_bin": "ACP_FIND_SKILLS_BIN",
    "router.install_skill_bin": "ACP_INSTALL_SKILL_BIN",
    "store.backend": "XWM_SESSION_STORE",
    "store.state_dir": "XWM_STATE_DIR",
    "store.redis_url": "XWM_REDIS_URL",
    "acp.default_route": "XWM_ACP_DEFAULT_ROUTE",
    "agents.detect": "XWM_AGENTS_DETECT",
    "agents.search_paths": "XWM_AGENTS_PATH",
    "agents.sandbox": "XWM_AGENTS_SANDBOX",
}
#: the bridge's own secrets: never copied into an agent's environment
SECRET_ENV_VARS = frozenset(
    {
        "ACP_AUTH_TOKEN",
        "XWM_CLIENT_TOKENS",
        "XWM_ADMIN_TOKENS",
        "INTERNAL_SERVICE_TOKEN",
        "BRIDGE_AUTH_TOKEN",
        "XWM_OPENCLAW_TOKEN",
        "LLM_API_KEY",
        "XWM_MULTI_AGENT_API_KEY",
        "VAULT_SERVER_ROOT_ACCESS_TOKEN",
        "XWM_REDIS_URL",
        "GEMINI_ADAPTER_AUTH_TOKEN",
    }
)
CONFIG_FILE_ENV = "XWM_BRIDGE_CONFIG"


#: the credentials of the config loaded last (``BridgeConfig.credentials()``, set by
#: ``load_config``): a key the YAML takes from a variable of another name
#: (``auth_api_key: ${GEMINI_API_KEY}``) is a secret of the bridge all the same
_config_credentials: frozenset[str] = frozenset()


def hold_back(credentials: Iterable[str]) -> None:
    """Keep these values (and variables holding them) out of helper commands too."""
    global _config_credentials
    _config_credentials = frozenset(v for v in credentials if v.strip())


def without_secrets(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment of a helper command the operator configured (``<cli> mcp
    list``, the skill commands, ``claude_review``): ``environ`` without the bridge's
    secret variables (:data:`SECRET_ENV_VARS`), nor any variable holding one of
    their values or a credential of the loaded config (:func:`hold_back`), or a
    comma-separated list with one. (Agents get less: only the names their provider
    lists, ``providers/stdio/launch.py``.)"""
    values: set[str] = set(_config_credentials)
    for name in SECRET_ENV_VARS:
        value = environ.get(name, "")
        values.update(p for p in (v.strip() for v in value.split(",")) if p)
    kept: dict[str, str] = {}
    for name, value in environ.items():
        if name in SECRET_ENV_VARS:
            continue
        if values and any(p.strip() in values for p in value.split(",")):
            continue
        kept[name] = value
    return kept


_LIST_SEPARATORS = {
    "allowed_origins": ",",
    "allowed_hosts": ",",
    "allowed_roots": ":",
    "client_tokens": ",",
    "admin_tokens": ",",
    "agents.search_paths": ":",
}
_ENV_FLAGS = {
    f.name: f.default
    for f in dataclasses.fields(BridgeConfig)
    if f.type in (bool, "bool") and isinstance(f.default, bool)
}


def _nested_flags() -> dict[str, bool]:
    """The boolean keys of :data:`NESTED_ENV_VARS` (``agents.detect``), with defaults."""
    sections = typing.get_type_hints(BridgeConfig)
    out: dict[str, bool] = {}
    for dotted in NESTED_ENV_VARS:
        section, name = dotted.split(".", 1)
        cls = sections.get(section)
        if not dataclasses.is_dataclass(cls):
            continue
        for f in dataclasses.fields(cls):
            if f.name == name and f.type in (bool, "bool") and isinstance(f.default, bool):
                out[dotted] = f.default
    return out


#: every boolean the environment sets: top-level keys and dotted nested ones
_NESTED_FLAGS = _nested_flags()
#: every boolean variable the config reads (the **flag** rule, warned: loading.py)
BOOL_ENV_VARS = (
    *(ENV_VARS[key] for key in _ENV_FLAGS if key in ENV_VARS),
    *(NESTED_ENV_VARS[key] for key in _NESTED_FLAGS),
)
#: a variable whose value is never written into a warning, whatever its type
_SECRET_NAME = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|CREDENTIAL", re.IGNORECASE)


@dataclasses.dataclass(frozen=True, slots=True)
class EnvWarning:
    """A boolean variable whose value was not understood: the default applied."""

    variable: str
    #: what it held (trimmed); None when the variable's name says it is a secret
    value: str | None
    default: bool

    def __str__(self) -> str:
        held = "a value" if self.value is None else repr(self.value)
        return (
            f"{self.variable}: {held} is not a boolean (1/true/yes/on or 0/false/no/off); "
            f"the default {str(self.default).lower()} applies"
        )


def env_flag(variable: str, value: str, default: bool) -> tuple[bool, EnvWarning | None]:
    """``value`` by the spec's **flag** rule, and a warning when it meant nothing."""
    word = coerce.text(value).lower()
    parsed = coerce.flag(word, default)
    if word in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        return parsed, None
    shown = None if _SECRET_NAME.search(variable) else coerce.text(value)
    return parsed, EnvWarning(variable, shown, default)


def provider_env_var(provider_id: str) -> str:
    return "XWM_PROVIDER_" + re.sub(r"[^A-Za-z0-9]", "_", provider_id).upper() + "_URL"
