"""The bridge's periodic store prune during a store outage: one warning naming the
store and the reason (no traceback, not once per round), one info line when the
store is back, and every failed prune counted in ``xwm_store_errors_total``."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

import pytest

from xwm_bridge.app import bridge as bridge_module
from xwm_bridge.app.bridge import Bridge
from xwm_bridge.config import load_config
from xwm_bridge.store.base import StoreUnavailable

REASON = "session store /var/lib/xwm/sessions.db: no answer from the store thread within 10s"


async def test_a_store_outage_is_one_warning_without_a_traceback_then_one_recovery(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {"ACP_AUTH_TOKEN": "t" * 32, "XWM_SESSION_STORE": "memory"}
    cfg = load_config(env=env).config
    # the reaper's round is 50 ms, and each round prunes
    bridge = Bridge(replace(cfg, limits=replace(cfg.limits, session_idle_ttl=0.1)))
    monkeypatch.setattr(bridge_module, "PRUNE_INTERVAL", 0.0)
    failures = [StoreUnavailable(REASON), TimeoutError(), StoreUnavailable(REASON)]
    calls = 0
    done = asyncio.Event()

    async def prune() -> int:
        nonlocal calls
        calls += 1
        if calls <= len(failures):
            raise failures[calls - 1]
        if calls == len(failures) + 2:  # two good rounds: the recovery is logged once
            done.set()
        return 0

    monkeypatch.setattr(bridge.store, "prune", prune)
    caplog.set_level(logging.DEBUG, logger="xwm_bridge")
    reaper = asyncio.ensure_future(bridge._reap())
    try:
        await asyncio.wait_for(done.wait(), 10)
    finally:
        reaper.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reaper
    mine = [r for r in caplog.records if r.name == "xwm_bridge.bridge" and "prune" in r.msg]
    warnings = [r for r in mine if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    (warning,) = warnings
    assert warning.levelno == logging.WARNING and warning.exc_info is None
    assert getattr(warning, "store", "") == bridge.store.name
    assert getattr(warning, "error", "") == REASON
    recovered = [r for r in mine if r.levelno == logging.INFO]
    assert len(recovered) == 1 and recovered[0].exc_info is None
    assert getattr(recovered[0], "store", "") == bridge.store.name
    counted = bridge.metrics.registry.get_sample_value("xwm_store_errors_total", {"kind": "prune"})
    assert counted == len(failures)
