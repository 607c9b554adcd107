"""Which signals stop a long-running mode (cli/common.py ``Signals``)."""

from __future__ import annotations

import signal

from xwm_bridge.cli.common import _stop_signals


def test_sighup_stops_unless_ignored_by_nohup() -> None:
    """SIGHUP (a closed terminal) drains like SIGTERM; under ``nohup`` (SIGHUP ignored
    when the process started) it stays ignored, as nohup promises."""
    before = signal.getsignal(signal.SIGHUP)
    try:
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        assert _stop_signals() == (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        assert _stop_signals() == (signal.SIGTERM, signal.SIGINT)
    finally:
        signal.signal(signal.SIGHUP, before)
