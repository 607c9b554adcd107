"""``xwm-bridge doctor``: the effective config (secrets masked, with sources) and a
reachability check of every enabled provider, using the deploy probe's request
(``acp.capabilities``, config.md §4).

Masked as in config_view.py (every ``Secret``-typed field, URL userinfo, provider
``env`` values); the whole output is then passed through the log redactor, so a
secret quoted in a check's error text is masked too.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from xwm_bridge.config import BridgeConfig, LoadedConfig, ProviderConfig
from xwm_bridge.config_view import masked
from xwm_bridge.endpoint import EndpointError, derive_endpoint
from xwm_bridge.netaddr import is_loopback_host, parse_listen
from xwm_bridge.providers.http1 import Http1Pool
from xwm_bridge.providers.upstream import UpstreamClient, UpstreamError

CHECK_TIMEOUT = 5.0


def masked_config(loaded: LoadedConfig) -> dict[str, Any]:
    """The effective config with every secret masked (config_view.py; the console
    shows the same data)."""
    return masked(loaded.config)


def check_stdio_agent(p: ProviderConfig) -> dict[str, Any]:
    """A local agent is usable when its executable resolves (it is not started here)."""
    exe = p.command[0]
    env_path = dict(item.split("=", 1) for item in p.env if "=" in item).get("PATH")
    path = shutil.which(exe, path=env_path)
    if path is None:
        return {"provider": p.id, "ok": False, "error": f"agent command not found: {exe}"}
    return {"provider": p.id, "ok": True, "detail": f"stdio agent {path}"}


async def check_provider(
    client: UpstreamClient, cfg: BridgeConfig, p: ProviderConfig
) -> dict[str, Any]:
    if p.is_stdio:
        return check_stdio_agent(p)
    try:
        endpoint = derive_endpoint(p.endpoint)
    except EndpointError as exc:
        return {"provider": p.id, "ok": False, "error": str(exc)}
    probe = dataclasses.replace(
        p,
        stream=False,
        connect_timeout=CHECK_TIMEOUT,
        read_timeout=CHECK_TIMEOUT,
        total_timeout=CHECK_TIMEOUT,
    )

    async def ignore(_: dict[str, Any]) -> None:
        return None

    try:
        reply = await client.call(
            probe,
            endpoint,
            cfg.provider_authorization(p),
            "acp.capabilities",
            {},
            ignore,
            stream=False,
        )
    except UpstreamError as exc:
        return {"provider": p.id, "url": endpoint.url, "ok": False, "error": str(exc)}
    if reply.get("jsonrpc") != "2.0" or "result" not in reply:
        return {
            "provider": p.id,
            "url": endpoint.url,
            "ok": False,
            "error": "not a JSON-RPC result",
        }
    return {"provider": p.id, "url": endpoint.url, "ok": True}


async def check_openclaw(cfg: BridgeConfig) -> dict[str, Any]:
    """TCP reachability of the ``openclaw`` gateway. Optional: runtimes are opened on a
    client's demand, so an unreachable gateway is reported but does not fail ``doctor``."""
    parts = urlsplit(cfg.openclaw_url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme in ("wss", "https") else 80)
    row: dict[str, Any] = {"check": "gateway", "provider": "openclaw", "optional": True}
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), CHECK_TIMEOUT)
    except (OSError, TimeoutError) as exc:
        return {**row, "ok": False, "error": f"cannot connect to {host}:{port}: {exc}"}
    writer.close()
    return {**row, "ok": True, "detail": f"{host}:{port} accepts connections"}


def passed(checks: list[dict[str, Any]]) -> bool:
    return all(c["ok"] or c.get("optional") for c in checks)


async def run_checks(cfg: BridgeConfig) -> list[dict[str, Any]]:
    checks: list[dict[str, Any]] = []
    host, _ = parse_listen(cfg.listen)
    exposed = not is_loopback_host(host)
    checks.append(
        {
            "check": "auth",
            "ok": cfg.authenticates or not exposed or cfg.allow_unauthenticated,
            "detail": "token set"
            if cfg.authenticates
            else (
                "no token: any bearer accepted"
                + (" on a non-loopback address" if exposed else " (loopback)")
            ),
        }
    )
    pool = Http1Pool()
    try:
        client = UpstreamClient(pool)
        results = await asyncio.gather(
            *(check_provider(client, cfg, p) for p in cfg.available_providers)
        )
    finally:
        await pool.close()
    checks += [{"check": "provider", **r} for r in results]
    checks.append(await check_openclaw(cfg))
    for p in cfg.providers:
        if not p.available:
            checks.append({"check": "provider", "provider": p.id, "ok": True, "detail": "disabled"})
    return checks


def render_text(
    config: Mapping[str, Any], sources: Mapping[str, str], checks: list[dict[str, Any]]
) -> str:
    lines = ["effective configuration (secrets masked):"]
    for key, value in config.items():
        if key in ("limits", "providers"):
            continue
        lines.append(f"  {key} = {value!r}  [{sources.get(key, 'default')}]")
    lines.append(f"  limits = {config['limits']!r}  [{sources.get('limits', 'default')}]")
    for i, p in enumerate(config["providers"]):
        src = sources.get(f"providers[{i}].endpoint", sources.get("providers", "default"))
        lines.append(f"  providers[{i}] = {p!r}  [{src}]")
    lines.append("checks:")
    for c in checks:
        mark = "ok  " if c["ok"] else "FAIL"
        what = c.get("provider", c["check"])
        detail = c.get("error") or c.get("detail") or c.get("url", "")
        lines.append(f"  [{mark}] {c['check']} {what}: {detail}")
    return "\n".join(lines)
