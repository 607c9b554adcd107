"""One typed, frozen configuration: defaults < YAML file < environment < flags.

The YAML file is optional (``--config`` or ``XWM_BRIDGE_CONFIG``); strings in it
may use ``${VAR}`` / ``${VAR:-default}`` interpolation. Every environment
variable of the original keeps its name and default (spec ``config.md`` §2.1).
A bad value raises :class:`ConfigError` whose message names the key and the
problem in one line; the CLI prints it and exits with status 2.

The modules, each importing only those above it:

- ``secret_fields``: the ``Secret`` mark and which values are credentials;
- ``sections``: the nested sections (``limits``, ``router``, ``agents``, ``store``…);
- ``model``: :class:`BridgeConfig`, providers, MCP servers, :class:`ConfigError`;
- ``env_vars``: the environment variables and the bridge's own secret ones;
- ``validate``: the checks a built config must pass;
- ``loading``: :func:`load_config` (YAML, interpolation, env, flags, typing).

Import from ``xwm_bridge.config``: every public name is here.
"""

from __future__ import annotations

from xwm_bridge.config.env_vars import (
    CONFIG_FILE_ENV,
    ENV_VARS,
    NESTED_ENV_VARS,
    SECRET_ENV_VARS,
    provider_env_var,
    without_secrets,
)
from xwm_bridge.config.loading import LoadedConfig, load_config
from xwm_bridge.config.model import (
    DEFAULT_ALLOWED_ORIGINS,
    DEFAULT_LISTEN,
    DEFAULT_PROVIDERS,
    LOG_FORMATS,
    LOG_LEVELS,
    MCP_TYPES,
    BridgeConfig,
    ConfigError,
    McpServerConfig,
    ProviderConfig,
)
from xwm_bridge.config.secret_fields import SECRET_MARK, Secret, secret_field, url_password
from xwm_bridge.config.sections import (
    MIB,
    SANDBOXES,
    STORE_BACKENDS,
    AcpConfig,
    AgentsConfig,
    ConsoleConfig,
    GatewayConfig,
    Limits,
    MountsConfig,
    MultiAgentConfig,
    PermissionRule,
    RouterConfig,
    StoreConfig,
    ToolbridgeConfig,
)

__all__ = [
    "CONFIG_FILE_ENV",
    "DEFAULT_ALLOWED_ORIGINS",
    "DEFAULT_LISTEN",
    "DEFAULT_PROVIDERS",
    "ENV_VARS",
    "LOG_FORMATS",
    "LOG_LEVELS",
    "MCP_TYPES",
    "MIB",
    "NESTED_ENV_VARS",
    "SANDBOXES",
    "SECRET_ENV_VARS",
    "SECRET_MARK",
    "STORE_BACKENDS",
    "AcpConfig",
    "AgentsConfig",
    "BridgeConfig",
    "ConfigError",
    "ConsoleConfig",
    "GatewayConfig",
    "Limits",
    "LoadedConfig",
    "McpServerConfig",
    "MountsConfig",
    "MultiAgentConfig",
    "PermissionRule",
    "ProviderConfig",
    "RouterConfig",
    "Secret",
    "StoreConfig",
    "ToolbridgeConfig",
    "load_config",
    "provider_env_var",
    "secret_field",
    "url_password",
    "without_secrets",
]
