"""Cost of persistence (issue 6): forwarded turns/s with the memory store vs SQLite
vs Redis, measured in one run.

    .venv/bin/python -m internal.bench.persistence           # ~1 minute
    .venv/bin/python -m internal.bench.persistence --quick   # ~20 s smoke run

Loopback only. Starts the fake upstream (20 ms per turn), a ``redis-server`` on a
free loopback port (skipped with a note when not installed), and one daemon per
store, each stopped by PID. Each cell: ``session.message`` at concurrency 64 (one
session per client worker, reused, so every turn writes its record twice and its
notifications to the ledger). Cells are interleaved over ``--repeats`` rounds
(memory, sqlite, redis, memory, …) so a noisy neighbour hits every store alike;
the best round of each store is reported. Target: SQLite and Redis ≥ 80% of the
memory store's throughput. Results: docs/architecture/performance.md.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from internal.bench.children import BenchError, LoadGen, Processes, Service, log
from internal.bench.forwarding import Bench, machine_facts
from internal.bench.forwarding import parse_args as forwarding_args

TARGET_RATIO = 0.80
STORES = ("memory", "sqlite", "redis")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def start_redis(procs: Processes) -> tuple[Service | None, str]:
    binary = shutil.which("redis-server")
    if binary is None:
        return None, ""
    port = _free_port()
    args = [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no"]
    args += ["--dir", str(procs.workdir)]
    svc = procs._spawn("redis", args, procs.env(), stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        except OSError:
            time.sleep(0.05)
            continue
        svc.port = port
        return svc, f"redis://127.0.0.1:{port}/0"
    raise BenchError("redis-server did not start within 10 s")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=4.0)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--latency", type=float, default=20.0, help="upstream ms per turn")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quick", action="store_true")
    own = p.parse_args(argv)
    if own.quick:
        own.duration, own.warmup, own.repeats = 1.5, 0.5, 2
    return own


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    base = forwarding_args(["--duration", str(args.duration), "--warmup", str(args.warmup)])
    workdir = Path(tempfile.mkdtemp(prefix="xwm-bench-store-"))
    procs = Processes(workdir)
    try:
        bench = Bench(base, procs, LoadGen(procs, base.client))
        fake = procs.start_fake(args.latency, base.chunks)
        redis, redis_url = start_redis(procs)
        stores = [s for s in STORES if s != "redis" or redis is not None]
        if redis is None:
            log("redis-server not installed: the redis cells are skipped")
        best: dict[str, dict[str, Any]] = {}
        for round_no in range(args.repeats):
            for store in stores:
                config: dict[str, Any] = {"store": {"backend": store}}
                if store == "redis":
                    config["store"]["redis_url"] = redis_url
                    config["store"]["redis_prefix"] = f"bench{round_no}:"
                bridge = procs.start_bridge(fake, bench.token, config=config)
                res = bench.cell(
                    bridge,
                    f"{store} round {round_no + 1} c{args.concurrency}",
                    kind="turn",
                    concurrency=args.concurrency,
                    session_prefix=f"{store}-r{round_no}",
                    pids=[bridge.pid, fake.pid] + ([redis.pid] if redis else []),
                )
                procs.stop(bridge)
                if res["errors"]:
                    raise BenchError(f"{store}: {res['errors']} errors: {res['first_error']}")
                if store not in best or res["per_s"] > best[store]["per_s"]:
                    best[store] = res
        print(report(best, args))
        return 0
    except BenchError as exc:
        log(f"failed: {exc} (logs in {workdir})")
        return 1
    finally:
        procs.stop_all()
        shutil.rmtree(workdir, ignore_errors=True)


def report(best: dict[str, dict[str, Any]], args: argparse.Namespace) -> str:
    facts = machine_facts()
    lines = [
        f"persistence cost: session.message, upstream {args.latency:g} ms, "
        f"concurrency {args.concurrency}, best of {args.repeats} interleaved rounds "
        f"of {args.duration:g} s",
        f"machine: {facts['nproc']} cores ({facts['cpu']}), Python {facts['python']}",
        "",
        "| store | turns/s | p50 ms | p99 ms | vs memory | target |",
        "|---|---:|---:|---:|---:|---|",
    ]
    reference = best["memory"]["per_s"] or 1.0
    for store, res in best.items():
        ratio = res["per_s"] / reference
        verdict = "" if store == "memory" else ("PASS" if ratio >= TARGET_RATIO else "MISS")
        lines.append(
            f"| {store} | {res['per_s']:.0f} | {res['p50_ms']:.2f} | {res['p99_ms']:.2f} "
            f"| {ratio:.0%} | {verdict} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
