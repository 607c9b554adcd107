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


async def test_a_signal_after_the_end_of_input_starts_no_second_drain() -> None:
    """With ``end_input``, a first signal ends the server's input and starts the drain
    beside it; one that comes after the input had ended (``finish`` is draining) must
    do neither: a drain task in the finished group was an error in the signal handler."""
    import asyncio
    import os
    from typing import Any

    from tests.conftest import wait_until
    from xwm_bridge.cli.common import Signals, _until_signal

    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    ended: list[bool] = []
    drains: list[bool] = []

    async def main() -> None:
        return None  # the end of input

    async def drain() -> None:
        drains.append(True)

    async def finish(signals: Signals) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        await wait_until(lambda: signals.count == 1)

    try:
        stopped = await _until_signal(
            main(), 0.0, finish, end_input=lambda: ended.append(True), drain=drain
        )
    finally:
        loop.set_exception_handler(None)
    assert stopped
    assert errors == [] and drains == [] and ended == []
