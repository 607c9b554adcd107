"""The ``mcpServers`` given to an agent on ``session/new``/``load``/``resume``
(sans-I/O).

Sources, in order: the provider's ``mcp_servers``, the bridge's own toolbridge
(``toolbridge: true``: ``<python> -m xwm_bridge toolbridge`` over stdio, with
``agents.toolbridge_env``), and — only when ``client_mcp_servers`` allows it —
the turn's ``mcpServers`` param. Servers over ``http``/``sse`` are given only to
agents whose ``mcpCapabilities`` accept that transport; every agent takes stdio.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from xwm_bridge import coerce
from xwm_bridge.config import BridgeConfig, McpServerConfig, ProviderConfig
from xwm_bridge.providers.stdio.features import AgentFeatures

TOOLBRIDGE_NAME = "xwm-toolbridge"
MAX_CLIENT_SERVERS = 16


class McpError(ValueError):
    """A client's ``mcpServers`` that cannot be accepted."""


def _pairs(items: Iterable[str], sep: str) -> list[dict[str, str]]:
    out = []
    for item in items:
        name, _, value = item.partition(sep)
        out.append({"name": name.strip(), "value": value.strip() if sep == ":" else value})
    return out


def wire(server: McpServerConfig) -> dict[str, Any]:
    """ACP ``McpServer`` (stdio has no ``type`` field in ACP v1)."""
    if server.type == "stdio":
        return {
            "name": server.name,
            "command": server.command,
            "args": list(server.args),
            "env": _pairs(server.env, "="),
        }
    return {
        "type": server.type,
        "name": server.name,
        "url": server.url,
        "headers": _pairs(server.headers, ":"),
    }


def toolbridge(config: BridgeConfig) -> dict[str, Any]:
    return {
        "name": TOOLBRIDGE_NAME,
        "command": sys.executable,
        "args": ["-m", "xwm_bridge", "toolbridge"],
        "env": _pairs(config.agents.toolbridge_env, "="),
    }


def _pair_list(value: Any, where: str) -> list[dict[str, str]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise McpError(f"{where} must be a list of {{name, value}}")
    out = []
    for item in value:
        if not (
            isinstance(item, dict)
            and isinstance(item.get("name"), str)
            and isinstance(item.get("value"), str)
        ):
            raise McpError(f"{where} must be a list of {{name, value}} strings")
        out.append({"name": item["name"], "value": item["value"]})
    return out


def parse_client(value: Any) -> list[dict[str, Any]]:
    """Validate a client's ``mcpServers`` (ACP shape) into clean ``McpServer`` objects."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise McpError("mcpServers must be a list")
    if len(value) > MAX_CLIENT_SERVERS:
        raise McpError(f"mcpServers: at most {MAX_CLIENT_SERVERS} servers")
    out: list[dict[str, Any]] = []
    for i, item in enumerate(value):
        where = f"mcpServers[{i}]"
        if not isinstance(item, dict) or not coerce.text(item.get("name")):
            raise McpError(f"{where}: an object with a name is required")
        kind = coerce.text(item.get("type"), "stdio")
        name = coerce.text(item.get("name"))
        if kind == "stdio":
            command, args = item.get("command"), item.get("args", [])
            if not isinstance(command, str) or not command:
                raise McpError(f"{where}.command: required for a stdio server")
            if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
                raise McpError(f"{where}.args: must be a list of strings")
            env = _pair_list(item.get("env"), f"{where}.env")
            out.append({"name": name, "command": command, "args": args, "env": env})
        elif kind in ("http", "sse"):
            url = coerce.text(item.get("url"))
            if urlsplit(url).scheme not in ("http", "https"):
                raise McpError(f"{where}.url: an http(s) URL is required")
            headers = _pair_list(item.get("headers"), f"{where}.headers")
            out.append({"type": kind, "name": name, "url": url, "headers": headers})
        else:
            raise McpError(f"{where}.type: must be stdio, http or sse")
    return out


def secret_values(servers: Iterable[dict[str, Any]]) -> list[str]:
    """Every env and header value: redacted from logs."""
    out: list[str] = []
    for s in servers:
        out += [p["value"] for p in s.get("env", []) + s.get("headers", [])]
    return out


@dataclass(frozen=True, slots=True)
class McpSelection:
    servers: tuple[dict[str, Any], ...]
    #: ``(name, reason)`` of servers the agent cannot take
    skipped: tuple[tuple[str, str], ...] = ()

    def names(self) -> list[str]:
        return [s["name"] for s in self.servers]


def select(
    provider: ProviderConfig,
    config: BridgeConfig,
    features: AgentFeatures,
    client: list[dict[str, Any]],
) -> McpSelection:
    candidates = [wire(m) for m in provider.mcp_servers]
    if provider.toolbridge:
        candidates.append(toolbridge(config))
    candidates += client
    kept: list[dict[str, Any]] = []
    skipped: list[tuple[str, str]] = []
    names: set[str] = set()
    for server in candidates:
        kind = server.get("type", "stdio")
        if server["name"] in names:
            skipped.append((server["name"], "duplicate name"))
        elif kind == "http" and not features.mcp_http:
            skipped.append((server["name"], "agent does not accept http MCP servers"))
        elif kind == "sse" and not features.mcp_sse:
            skipped.append((server["name"], "agent does not accept sse MCP servers"))
        else:
            names.add(server["name"])
            kept.append(server)
    return McpSelection(tuple(kept), tuple(skipped))
