"""``xwm-bridge doctor``: the effective config (secrets masked, with sources) and a
check of every configured component: HTTP/WS providers answer the deploy probe's
request (``acp.capabilities``, config.md §4); stdio agents — configured or found
on PATH (providers/stdio/registry.py) — are started and must answer
``initialize`` within ``agents.probe_timeout``; the OpenClaw gateway (when
configured) accepts a connection; the session store is usable;
``agents.permission_rules_file`` (when set) reads as a rule list. Known agents that
were not found are listed with the reason (not a failure); components nobody
configured are left out; ``--offline`` validates the config only.

Masked as in config_view.py (every ``Secret``-typed field, URL userinfo, ``env``
values); the whole output is then passed through the log redactor, so a secret
quoted in a check's error text is masked too.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import yaml

from xwm_bridge.config import DEFAULT_PROVIDERS, BridgeConfig, LoadedConfig, ProviderConfig
from xwm_bridge.config_view import masked
from xwm_bridge.endpoint import EndpointError, derive_endpoint
from xwm_bridge.netaddr import is_loopback_host, parse_listen
from xwm_bridge.providers.http1 import Http1Error
from xwm_bridge.providers.http1_pool import Http1Pool
from xwm_bridge.providers.stdio import policy, registry
from xwm_bridge.providers.stdio.probe import probe
from xwm_bridge.providers.tunnel import check_tunnel
from xwm_bridge.providers.upstream import UpstreamClient, UpstreamError
from xwm_bridge.proxy import ProxySettings
from xwm_bridge.store.health import probe_store
from xwm_bridge.tasks import wait_for

CHECK_TIMEOUT = 5.0


def masked_config(loaded: LoadedConfig) -> tuple[dict[str, Any], dict[str, str]]:
    """The effective config with every secret masked (config_view.py; the console
    shows the same data) and where each value came from: the config as the bridge
    runs it, with the agents found on PATH among its providers (in their place: first
    when nothing is configured), so ``providers[i]`` of the sources is renumbered and
    a found agent's source is ``detected: <path>``."""
    detection = registry.detect(loaded.config)
    found = {a.id: a.path for a in detection.agents if a.found and a.source == "registry"}
    index = {id(p): i for i, p in enumerate(loaded.config.providers)}
    sources = {k: v for k, v in loaded.sources.items() if not k.startswith("providers[")}
    for j, p in enumerate(detection.config.providers):
        i = index.get(id(p))
        if i is None:
            sources[f"providers[{j}]"] = f"detected: {found.get(p.id, '')}"
            continue
        for key, value in loaded.sources.items():
            head = f"providers[{i}]"
            if key == head or key.startswith(head + "."):
                sources[f"providers[{j}]" + key[len(head) :]] = value
    return masked(detection.config), sources


DEFAULT_PROVIDER_HINT = (
    "a remote provider of the built-in default catalog: list your own in providers: "
    "(the file replaces the catalog), or point it elsewhere with XWM_PROVIDER_<ID>_URL"
)
STDIO_WITHOUT_COMMAND = "kind: stdio without a command: never used"


async def check_stdio_agent(cfg: BridgeConfig, p: ProviderConfig) -> dict[str, Any]:
    """A local agent is usable when it starts and answers ``initialize`` in time."""
    exe = p.command[0]
    env_path = dict(item.split("=", 1) for item in p.env if "=" in item).get("PATH")
    path = registry.which(exe, cfg.agents.search_paths, env_path or os.environ.get("PATH", ""))
    if path is None:
        return {"provider": p.id, "ok": False, "error": f"agent {registry.not_found(exe)}"}
    result = await probe(p, cfg)
    row: dict[str, Any] = {"provider": p.id, "ok": result.ok, "command": path}
    row["detail" if result.ok else "error"] = result.detail
    return row


def agent_rows(detection: registry.Detection) -> list[dict[str, Any]]:
    """Known agents that are not providers: reported with the reason, never fatal."""
    return [
        {"check": "agent", "provider": a.id, "ok": False, "optional": True, "error": a.reason}
        for a in detection.agents
        if not a.found and a.source == "registry"
    ]


async def check_provider(
    client: UpstreamClient,
    cfg: BridgeConfig,
    p: ProviderConfig,
    proxies: ProxySettings | None = None,
) -> dict[str, Any]:
    if p.is_stdio:
        return await check_stdio_agent(cfg, p)
    try:
        endpoint = derive_endpoint(p.endpoint)
    except EndpointError as exc:
        return {"provider": p.id, "ok": False, "error": str(exc)}
    where: dict[str, Any] = {"url": endpoint.url}
    if proxies is not None and proxies.active:
        where["proxy"] = proxies.describe(endpoint.url)
    probe = dataclasses.replace(
        p,
        stream=False,
        connect_timeout=CHECK_TIMEOUT,
        read_timeout=CHECK_TIMEOUT,
        total_timeout=CHECK_TIMEOUT,
    )

    async def ignore(_: list[dict[str, Any]]) -> None:
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
        # doctor's own deadline, not the provider's total_timeout the message names
        error = f"no answer within {CHECK_TIMEOUT:g}s" if exc.timed_out else str(exc)
        return {"provider": p.id, **where, "ok": False, "error": error}
    if reply.get("jsonrpc") != "2.0" or "result" not in reply:
        return {"provider": p.id, **where, "ok": False, "error": "not a JSON-RPC result"}
    return {"provider": p.id, **where, "ok": True}


def openclaw_configured(loaded: LoadedConfig) -> bool:
    """Somebody set the ``openclaw`` gateway up (the built-in URL alone is not that)."""
    cfg = loaded.config
    return loaded.sources.get("openclaw_url", "default") != "default" or bool(cfg.openclaw_token)


async def check_openclaw(cfg: BridgeConfig, proxies: ProxySettings | None = None) -> dict[str, Any]:
    """TCP reachability of the configured ``openclaw`` gateway (through a CONNECT
    tunnel when a proxy applies to it)."""
    parts = urlsplit(cfg.openclaw_url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme in ("wss", "https") else 80)
    row: dict[str, Any] = {"check": "gateway", "provider": "openclaw"}
    route = proxies.for_url(cfg.openclaw_url) if proxies is not None else None
    if route is not None:
        row["proxy"] = f"via {route.display}"
        try:
            await wait_for(check_tunnel(route, host, port), CHECK_TIMEOUT)
        except Http1Error as exc:
            return {**row, "ok": False, "error": str(exc)}
        except TimeoutError:
            error = f"no answer to CONNECT from proxy {route.address} in {CHECK_TIMEOUT:g}s"
            return {**row, "ok": False, "error": error}
        return {**row, "ok": True, "detail": f"{host}:{port} reachable via the proxy"}
    try:
        _, writer = await wait_for(asyncio.open_connection(host, port), CHECK_TIMEOUT)
    except (OSError, TimeoutError) as exc:
        return {**row, "ok": False, "error": f"cannot connect to {host}:{port}: {exc}"}
    writer.close()
    return {**row, "ok": True, "detail": f"{host}:{port} accepts connections"}


def proxy_row(proxies: ProxySettings) -> dict[str, Any]:
    """Which forward proxy applies (credentials masked)."""
    if not proxies.active:
        return {"check": "proxy", "ok": True, "detail": "none (every call goes direct)"}
    s = proxies.summary()
    parts = [f"{k}: {s[k] or 'direct'}" for k in ("http", "https")]
    parts.append(f"no_proxy: {s['no_proxy'] or '(empty)'}")
    return {"check": "proxy", "ok": True, "detail": "; ".join(parts)}


def passed(checks: list[dict[str, Any]]) -> bool:
    """Every check passed; optional rows (known agents that are not installed) never fail."""
    return all(c["ok"] or c.get("optional") for c in checks)


def permission_rules_row(path: str) -> dict[str, Any]:
    """``agents.permission_rules_file`` reads as a rule list. A path nobody can read
    is a failure: the bridge runs without its rules (every tool call asks) until it
    appears, which a typo makes never."""
    row: dict[str, Any] = {"check": "permissions", "provider": "permission_rules_file"}
    try:
        rules = policy.read_rules(path)
    except OSError as exc:
        return {**row, "ok": False, "error": f"cannot read {path}: {exc.strerror or exc}"}
    except ValueError as exc:  # names the file and the entry
        return {**row, "ok": False, "error": str(exc)}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        return {**row, "ok": False, "error": f"{path}: {problem}{where}"}
    return {**row, "ok": True, "detail": f"{path}: {len(rules)} rule(s)"}


def config_checks(loaded: LoadedConfig) -> list[dict[str, Any]]:
    """What the config alone says (no network, no process started)."""
    cfg = loaded.config
    checks: list[dict[str, Any]] = [
        {
            "check": "config",
            "ok": True,
            "detail": f"valid ({len(cfg.available_providers)} provider(s) enabled)",
        }
    ]
    for p in cfg.providers:
        if p.is_stdio and p.enabled and not p.command:
            checks.append(
                {
                    "check": "provider",
                    "provider": p.id,
                    "ok": True,
                    "warning": STDIO_WITHOUT_COMMAND,
                }
            )
    if cfg.agents.permission_rules_file:
        checks.append(permission_rules_row(cfg.agents.permission_rules_file))
    if not cfg.available_providers:
        checks.append(
            {
                "check": "config",
                "ok": True,
                "warning": "no provider is enabled: single-agent turns answer unavailable",
            }
        )
    return checks


async def run_checks(loaded: LoadedConfig, *, offline: bool = False) -> list[dict[str, Any]]:
    detection = registry.detect(loaded.config)
    cfg = detection.config  # with the agents found on PATH
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
    checks += config_checks(loaded)
    proxies = loaded.proxies
    checks.append(proxy_row(proxies))
    if offline:
        return checks
    pool = Http1Pool()
    try:
        client = UpstreamClient(pool, proxies)
        results = await asyncio.gather(
            *(check_provider(client, cfg, p, proxies) for p in cfg.available_providers)
        )
    finally:
        await pool.close()
    defaults = set(DEFAULT_PROVIDERS)
    for p, r in zip(cfg.available_providers, results, strict=True):
        if not r["ok"] and p in defaults:
            r["hint"] = DEFAULT_PROVIDER_HINT
    checks += [{"check": "provider", **r} for r in results]
    checks += agent_rows(detection)
    if openclaw_configured(loaded):
        checks.append(await check_openclaw(cfg, proxies))
    store = await probe_store(cfg, CHECK_TIMEOUT)
    row: dict[str, Any] = {"check": "store", "ok": store.ok}
    checks.append(
        {**row, "error": store.error} if not store.ok else {**row, "detail": store.detail}
    )
    for p in cfg.providers:
        if not p.available and not (p.is_stdio and p.enabled):
            checks.append({"check": "provider", "provider": p.id, "ok": True, "detail": "disabled"})
    return checks


def render_text(
    config: Mapping[str, Any], sources: Mapping[str, str], checks: list[dict[str, Any]]
) -> str:
    lines = ["effective configuration (secrets masked):"]

    def source(key: str) -> str:
        """Where ``key`` came from, and a section's keys set elsewhere (``store`` from
        the defaults with ``state_dir`` from XWM_STATE_DIR read as all defaults)."""
        nested = [
            f"{k[len(key) + 1 :]}: {v}" for k, v in sources.items() if k.startswith(key + ".")
        ]
        return "; ".join([sources.get(key, "default"), *nested])

    for key, value in config.items():
        if key in ("limits", "providers"):
            continue
        lines.append(f"  {key} = {value!r}  [{source(key)}]")
    lines.append(f"  limits = {config['limits']!r}  [{source('limits')}]")
    for i, p in enumerate(config["providers"]):
        src = sources.get(f"providers[{i}]") or sources.get(
            f"providers[{i}].endpoint", sources.get("providers", "default")
        )
        lines.append(f"  providers[{i}] = {p!r}  [{src}]")
    lines.append("checks:")
    #: each hint once, after the checks, with the rows it is for (in --json: per row)
    hints: dict[str, list[str]] = {}
    for c in checks:
        if c["ok"]:
            mark = "WARN" if c.get("warning") else "ok  "
        else:
            mark = "--  " if c.get("optional") else "FAIL"
        what = c.get("provider", c["check"])
        detail = c.get("error") or c.get("warning") or c.get("detail") or c.get("url", "")
        if c.get("proxy"):
            detail += f" ({c['proxy']})"
        if c.get("hint"):
            hints.setdefault(c["hint"], []).append(str(what))
        lines.append(f"  [{mark}] {c['check']} {what}: {detail}")
    lines += [f"  hint ({', '.join(whats)}): {hint}" for hint, whats in hints.items()]
    return "\n".join(lines)
