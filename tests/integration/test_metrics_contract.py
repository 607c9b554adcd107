"""/metrics as operations.md documents it: the table of metrics matches the live
registry (names and label names), and no client-chosen string becomes a label value."""

from __future__ import annotations

import re
from typing import Any

import aiohttp
from prometheus_client.metrics import MetricWrapperBase

from tests.conftest import (
    AUTH,
    ROOT,
    FakeUpstream,
    StartBridge,
    provider_env,
    rpc,
    session_params,
)

OPERATIONS = ROOT / "docs" / "architecture" / "operations.md"
MARK = "zzclient"  # in every string this test's client chooses


def documented_metrics() -> dict[str, set[str]]:
    """operations.md's metrics table: name → label names (``—``: none)."""
    text = OPERATIONS.read_text()
    table = text.split("Metrics (no `_created` series):", 1)[1].split("\n\n", 2)[1]
    rows: dict[str, set[str]] = {}
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        names = re.findall(r"`([a-z_]+)`", cells[0])
        # label names: the backticked words outside parentheses (those list values)
        labels = set(re.findall(r"`([a-z_]+)`", re.sub(r"\([^)]*\)", "", cells[1])))
        for name in names:
            rows[name] = labels
    assert rows, "no metrics table in operations.md"
    return rows


def live_metrics() -> dict[str, set[str]]:
    """The registry of a bridge as ``serve`` builds it: every family with its labels
    (the declared label names of a labelled metric with no series yet, too)."""
    from xwm_bridge.app.bridge import Bridge
    from xwm_bridge.config import BridgeConfig
    from xwm_bridge.config.sections import StoreConfig

    metrics = Bridge(BridgeConfig(store=StoreConfig(backend="memory"))).metrics
    found: dict[str, set[str]] = {}
    for family in metrics.registry.collect():
        name = family.name + ("_total" if family.type == "counter" else "")
        labels: set[str] = set()
        for sample in family.samples:
            labels |= set(sample.labels) - {"le"}
        found[name] = labels
    for value in vars(metrics).values():
        if isinstance(value, MetricWrapperBase):
            name = value._name + ("_total" if value._type == "counter" else "")
            found[name] = set(value._labelnames)
    return found


def test_the_documented_metrics_are_the_live_ones() -> None:
    documented, live = documented_metrics(), live_metrics()
    ours = {n: labels for n, labels in live.items() if n.startswith("xwm_")}
    undocumented = sorted(set(ours) - set(documented))
    missing = sorted(n for n in documented if n.startswith("xwm_") and n not in ours)
    assert not undocumented and not missing, (undocumented, missing)
    wrong = {n: (documented[n], ours[n]) for n in ours if documented[n] != ours[n]}
    assert not wrong, wrong  # (documented labels, live labels)
    for name in documented:
        if name.startswith("process_"):
            assert name in live, name


async def test_no_client_string_becomes_a_label_value(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    """Methods, routing targets, provider ids, session and thread ids, models, paths and
    origins chosen by a client: none may turn into a series of its own (each would grow
    /metrics without bound)."""
    bridge = await start_bridge(env=provider_env(fake_upstream.url))
    for i in range(3):
        await rpc(http, bridge.rpc_url, f"{MARK}.method{i}")
        await rpc(http, bridge.rpc_url, f"session.{MARK}{i}")
        params: dict[str, Any] = session_params(
            f"{MARK}-s{i}", "hi", threadId=f"{MARK}-t{i}", provider=f"{MARK}-p{i}",
            model=f"{MARK}-m{i}",
        )  # fmt: skip
        await rpc(http, bridge.rpc_url, "session.start", params)
        for routing in (
            {"routingMode": "explicit", "explicitExecutionTarget": f"{MARK}-target{i}"},
            {"routingMode": "explicit", "explicitExecutionTarget": "singleAgent",
             "explicitProviderId": f"{MARK}-provider{i}"},
            {"routingMode": f"{MARK}-mode{i}"},
        ):  # fmt: skip
            turn = {"sessionId": f"{MARK}-r{i}", "taskPrompt": "hi", "routing": routing}
            await rpc(http, bridge.rpc_url, "session.message", turn)
        async with http.post(f"{bridge.url}/{MARK}/path{i}", headers=AUTH) as resp:
            await resp.read()
        headers = {**AUTH, "Origin": f"https://{MARK}{i}.example"}
        async with http.post(bridge.rpc_url, data=b"{}", headers=headers) as resp:
            assert resp.status == 403
        async with http.post(
            bridge.rpc_url, data=b"{}", headers={"Authorization": f"Bearer {MARK}{i}"}
        ) as resp:
            assert resp.status == 401
    async with http.ws_connect(bridge.ws_url, headers=AUTH) as ws:
        await ws.send_str(f'{{"jsonrpc":"2.0","id":1,"method":"{MARK}.ws"}}')
        await ws.receive()
    async with http.get(f"{bridge.url}/metrics") as resp:
        text = await resp.text()
    assert 'method="other"' in text
    leaked = [line for line in text.splitlines() if MARK in line]
    assert not leaked, leaked[:5]
