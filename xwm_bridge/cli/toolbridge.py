"""``xwm-bridge toolbridge``: the MCP tool bridge on stdin/stdout (the mode when no
command is given)."""

from __future__ import annotations

import os
import sys

from xwm_bridge.cli.common import (
    CONFIG_OPTION,
    LOG_FORMAT_OPTION,
    LOG_LEVEL_OPTION,
    _load,
    _run,
    _until_signal,
    start_logging,
)
from xwm_bridge.cli.group import cli
from xwm_bridge.config import BridgeConfig
from xwm_bridge.wire import WireEncoder


@cli.command("toolbridge")
@CONFIG_OPTION
@LOG_LEVEL_OPTION
@LOG_FORMAT_OPTION
def toolbridge(config_file: str | None, log_level: str | None, log_format: str | None) -> None:
    """Serve the MCP tool bridge on stdin/stdout (also the mode when no command is given).

    \b
    Tools: chat (OpenAI-compatible; LLM_API_KEY, LLM_BASE_URL, LLM_MODEL),
    claude_review (the Claude CLI; CLAUDE_BIN, CLAUDE_REVIEW_*),
    vault_kv (KV v2; VAULT_SERVER_URL, VAULT_SERVER_ROOT_ACCESS_TOKEN, VAULT_NAMESPACE).
    Input: newline JSON or Content-Length frames; output: one JSON object per line
    (a JSON-RPC batch, served under protocol 2025-03-26 only: one array per line).
    Logs go to stderr. Exits 0 at end of input once running calls finish.
    """
    loaded = _load(config_file, log_level=log_level, log_format=log_format)
    cfg = loaded.config
    start_logging(cfg, loaded)
    sys.exit(_run(_toolbridge(cfg)))


async def _toolbridge(cfg: BridgeConfig) -> int:
    import aiohttp

    from xwm_bridge.proxy import ProxySettings, aiohttp_session_options
    from xwm_bridge.toolbridge.server import ToolbridgeServer
    from xwm_bridge.transport.stdio import stdin_reader, stdout_writer

    proxies = ProxySettings.from_env(os.environ)  # load_config refused a bad value
    async with aiohttp.ClientSession(**aiohttp_session_options(proxies)) as http:
        server = ToolbridgeServer(
            cfg.toolbridge,
            http,
            stdin_reader(),
            stdout_writer(),
            max_message=cfg.limits.max_body_bytes,
            wire=WireEncoder(cfg.credentials()),
            proxies=proxies,
        )
        await _until_signal(server.serve())
    return 0
