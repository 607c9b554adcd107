"""The bridge's CPU per forwarded turn, per thread, with the daemon in this process.

``python -m internal.bench.turncpu`` runs the 20 ms x 64 turn cell of
``internal.bench.forwarding`` in small: the fake upstream
(``internal.peers.fake_acp --latency-ms 20 --chunks 3``) and a closed-loop client
(64 workers, one keep-alive connection and one reused session each, the load
generator's ``session.message`` body with explicit routing) run as child processes;
the daemon (the app ``serve`` builds, on uvloop, SQLite store, log lines to stderr)
runs in this process, so the CPU clock of each of its threads can be read: the event
loop's, the store thread's and the log writer's, and the whole process's, per turn.
``--profile`` adds a window under cProfile and reports its calls per turn on the
loop's thread (all, and Python functions only: deterministic where CPU time is
noisy); ``--dump PATH`` also writes that window's stats for ``pstats``.

For A/B runs of two trees, run it from each (``PYTHONPATH=TREE``) in alternation:
only same-run alternating comparisons are worth much on a shared machine. The fake
and the client are separate processes because threads of this one would take the
GIL from the loop's thread at every socket call, which made its CPU per turn swing
by a third from run to run. Prints one JSON object (see :func:`summary`).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from typing import Any

from internal.bench.clients import RawHttpClient
from internal.bench.loadgen import _body, _check

TOKEN = "turncpu-token-0123456789"


def per_turn(
    before: Mapping[str, float], after: Mapping[str, float], turns: int
) -> dict[str, float]:
    """Microseconds of each clock per turn between two readings."""
    return {k: round((after[k] - before[k]) / turns * 1e6, 2) for k in before}


def calls_per_turn(
    stats: Mapping[tuple[str, int, str], tuple[Any, ...]], turns: int
) -> dict[str, float]:
    """cProfile's calls per turn: every call, and calls of Python functions (a
    built-in's file name is ``~``)."""
    total = sum(v[1] for v in stats.values())
    python = sum(v[1] for k, v in stats.items() if k[0] != "~")
    return {"calls": round(total / turns, 1), "py_calls": round(python / turns, 1)}


def summary(windows: Mapping[str, dict[str, Any]], errors: int) -> dict[str, Any]:
    """The printed result: each window's turns and µs per turn of each thread, the
    calls per turn of a profiled one, and the client's failed answers."""
    return {**windows, "errors": errors}


async def _client(url: str, concurrency: int, warmup: float, seconds: float, windows: str) -> None:
    """The load: prints ``start NAME`` / ``end NAME TURNS`` around each window, then
    ``errors N``; the daemon's side reads the lines to take its clock readings."""
    done = errors = 0
    stop = False

    async def worker(i: int) -> None:
        nonlocal done, errors
        headers = {
            "Authorization": f"Bearer {TOKEN}",
            "Content-Type": "application/json",
            "Accept": "application/json",
        }
        client = RawHttpClient(url, headers)
        session, rid = f"turncpu-{i}", 0
        while not stop:
            rid += 1
            status, data = await client.post(_body("turn", rid, session))
            if _check("turn", status, data):
                errors += 1
            done += 1
        await client.close()

    tasks = [asyncio.create_task(worker(i)) for i in range(concurrency)]
    await asyncio.sleep(warmup)
    for name in windows.split(","):
        first = done
        print("start", name, flush=True)
        await asyncio.sleep(seconds)
        print("end", name, done - first, flush=True)
        await asyncio.sleep(0.3)  # the daemon's reading first, then the next window
    stop = True
    await asyncio.gather(*tasks)
    print("errors", errors, flush=True)


async def _daemon(args: argparse.Namespace) -> dict[str, Any]:
    py = sys.executable
    fake = await asyncio.create_subprocess_exec(
        py, "-m", "internal.peers.fake_acp", "--latency-ms", "20", "--chunks", "3",
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert fake.stdout is not None
    fake_port = int((await fake.stdout.readline()).decode().rsplit(":", 1)[1])
    from xwm_bridge.app.bridge import Bridge
    from xwm_bridge.app.dispatcher import Dispatcher
    from xwm_bridge.app.methods import BridgeMethods
    from xwm_bridge.cli.common import start_logging
    from xwm_bridge.config import load_config
    from xwm_bridge.heap import freeze_startup
    from xwm_bridge.transport.http import SERVE_PATHS, HttpTransport
    from xwm_bridge.transport.serving import Server

    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACP_", "XWM_"))}
    env["ACP_AUTH_TOKEN"] = TOKEN
    env["XWM_PROVIDER_CODEX_URL"] = f"http://127.0.0.1:{fake_port}"
    env["XWM_STATE_DIR"] = tempfile.mkdtemp(prefix="turncpu-state-")
    os.environ.clear()
    os.environ.update(env)
    loaded = load_config(flags={"listen": "127.0.0.1:0", "log_level": "info"})
    start_logging(loaded.config, loaded)
    bridge = Bridge(loaded.config, loaded.sources, loaded.proxies)
    table = BridgeMethods(bridge).table()
    server = Server(HttpTransport(bridge, Dispatcher(table, bridge.metrics)), SERVE_PATHS)
    await server.setup()
    port = await server.listen("127.0.0.1", 0)
    freeze_startup()
    clocks = {"loop": time.pthread_getcpuclockid(threading.get_ident())}
    for thread in threading.enumerate():
        if thread.ident is not None and "sqlite" in thread.name:
            clocks["store"] = time.pthread_getcpuclockid(thread.ident)
        elif thread.ident is not None and thread.name == "log-writer":
            clocks["log"] = time.pthread_getcpuclockid(thread.ident)
    clocks["process"] = time.CLOCK_PROCESS_CPUTIME_ID
    windows = "cpu,profile" if args.profile else "cpu"
    client = await asyncio.create_subprocess_exec(
        py, "-m", "internal.bench.turncpu", "--client", f"http://127.0.0.1:{port}/acp/rpc",
        "--concurrency", str(args.concurrency), "--warmup", str(args.warmup),
        "--seconds", str(args.seconds), "--windows", windows,
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert client.stdout is not None
    profile = cProfile.Profile()
    out: dict[str, dict[str, Any]] = {}
    errors = -1
    before: dict[str, float] = {}
    try:
        while words := (await client.stdout.readline()).decode().split():
            if words[0] == "start":
                before = {k: time.clock_gettime(c) for k, c in clocks.items()}
                if words[1] == "profile":
                    profile.enable()
            elif words[0] == "end":
                if words[1] == "profile":
                    profile.disable()
                after = {k: time.clock_gettime(c) for k, c in clocks.items()}
                turns = int(words[2])
                out[words[1]] = {"turns": turns, **per_turn(before, after, turns)}
                if words[1] == "profile":
                    if args.dump:
                        profile.dump_stats(args.dump)
                    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
                    out[words[1]].update(calls_per_turn(stats, turns))
            elif words[0] == "errors":
                errors = int(words[1])
        await client.wait()
    finally:
        await server.close()
        fake.terminate()
        await fake.wait()
    return summary(out, errors)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="each window (default 4)")
    parser.add_argument("--warmup", type=float, default=1.5)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--profile", action="store_true", help="add a cProfile window")
    parser.add_argument("--dump", metavar="PATH", help="write the cProfile window's stats")
    parser.add_argument("--client", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--windows", default="cpu", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        asyncio.run(_client(args.client, args.concurrency, args.warmup, args.seconds, args.windows))
        return
    import uvloop  # the daemon's loop in the bench (the [fast] extra)

    print(json.dumps(uvloop.run(_daemon(args))))


if __name__ == "__main__":
    main()
