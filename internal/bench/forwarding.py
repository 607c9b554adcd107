"""Forwarding benchmark: the bridge vs. the fake upstream directly, measured in one run.

    .venv/bin/python -m internal.bench.forwarding            # full run, ~3 minutes
    .venv/bin/python -m internal.bench.forwarding --quick    # ~1 minute smoke run

Loopback only. Starts its own processes (fake upstream ``internal.peers.fake_acp``,
the daemon ``python -m xwm_bridge serve``, and a load generator
``internal.bench.loadgen``) and stops each by PID. Measures:

1. forwarded ``session.message`` turns (plain JSON ``POST /acp/rpc``, explicit
   routing to ``codex``, one session per client worker, reused across
   iterations) at upstream latency 0 ms × client concurrency 1/64/256 and
   20 ms × 16/64/256: turns/s, p50, p99 through the bridge and directly
   against the fake, plus bridge/direct throughput and the latency the bridge
   adds; CPU per turn of each process;
2. ``acp.capabilities`` at concurrency 64 over plain HTTP, and at concurrency
   16 on the WebSocket (one ``GET /acp`` connection per worker), bridge and
   direct;
3. a streamed turn: the fake sends 50 ``session.update`` deltas per turn, the
   client reads SSE (20 ms × 64): time to the first chunk, CPU per relayed
   notification;
4. the daemon's VmRSS/VmHWM before and after 10,000 distinct sessions, once
   they are reaped (``limits.session_idle_ttl: 1``).

Diagnostic cells re-run 20 ms × 64 with two configuration changes, to
attribute the overhead. Targets (``internal.bench.targets``) are printed
PASS/MISS, never asserted. Results: docs/architecture/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from internal.bench.children import BenchError, LoadGen, Processes, Service, log
from internal.bench.procfs import cpu_model, cpu_seconds, machine_busy_seconds, status_kib
from internal.bench.report import MIB, hot_spots, report
from internal.bench.streamed import stream_prompt
from internal.bench.targets import (
    CAPS_CONCURRENCY,
    STREAM_CHUNKS,
    STREAM_CONCURRENCY,
    STREAM_LATENCY_MS,
    TARGET_CONCURRENCY,
    TARGET_LATENCY_MS,
    WS_CONCURRENCY,
    evaluate,
)

# --- measurements --------------------------------------------------------------------------


@dataclass
class Bench:
    args: argparse.Namespace
    procs: Processes
    loadgen: LoadGen
    token: str = field(default_factory=lambda: secrets.token_hex(16))
    results: dict[str, Any] = field(default_factory=dict)
    quiet_waited: float = 0.0

    def wait_quiet(self) -> float:
        """Wait (bounded) until processes not started by this run use little CPU.

        The machine may be shared (other test suites); their CPU would be taken
        from the bridge. Returns the last measured foreign load, in cores.
        """
        a = self.args
        budget = min(a.quiet_wait, max(0.0, a.quiet_budget - self.quiet_waited))
        started = time.monotonic()
        while True:
            pids = [svc.pid for svc in self.procs.started]
            t0, busy0 = time.monotonic(), machine_busy_seconds()
            ours0 = sum(cpu_seconds(pid) for pid in pids)
            time.sleep(0.5)
            elapsed = time.monotonic() - t0
            ours = sum(cpu_seconds(pid) for pid in pids) - ours0
            load = max(0.0, (machine_busy_seconds() - busy0 - ours) / elapsed)
            if load < a.quiet_threshold or time.monotonic() - started >= budget:
                break
        waited = time.monotonic() - started - 0.5
        if waited > 0.1:
            self.quiet_waited += waited
            log(f"waited {waited:.1f} s for other processes to go quiet (now {load:.2f} cores)")
        return load

    def cell(self, target: Service, label: str, **kw: Any) -> dict[str, Any]:
        kw.setdefault("warmup", self.args.warmup)
        kw.setdefault("duration", self.args.duration)
        kw.setdefault("url", target.rpc_url)
        before = self.wait_quiet()
        res = self.loadgen.run(token=self.token, **kw)
        cpu = res["cpu_s"]
        done = max(1, res["completed"])
        res["cpu_ms_per_op"] = {name: 1000 * s / done for name, s in cpu.items()}
        res["client_cpu_ms_per_op"] = 1000 * res["client_cpu_s"] / done
        ours = sum(cpu.values()) + res["client_cpu_s"]
        window = res["window_s"] or 1.0
        res["other_cores"] = max(0.0, (res["machine_busy_s"] - ours) / window)
        res["other_cores_before"] = before
        log(
            f"{label}: {res['per_s']:.0f}/s p50 {res['p50_ms']:.2f} ms "
            f"p99 {res['p99_ms']:.2f} ms errors {res['errors']} unfinished {res['unfinished']} "
            f"other load {res['other_cores']:.2f} cores"
            + (f" first error: {res['first_error']}" if res["first_error"] else "")
        )
        return res

    def turns(self) -> None:
        rows: list[dict[str, Any]] = []
        for latency in self.args.latencies:
            fake = self.procs.start_fake(latency, self.args.chunks)
            bridge = self.procs.start_bridge(fake, self.token)
            pids = {"bridge": bridge.pid, "fake": fake.pid}
            grid = concurrency_grid(self.args, latency)
            for conc in grid:
                row: dict[str, Any] = {"latency_ms": latency, "concurrency": conc}
                for path, target in (("direct", fake), ("bridge", bridge)):
                    res = self.cell(
                        target,
                        f"turns {latency:g} ms c{conc} {path}",
                        kind="turn",
                        concurrency=conc,
                        session_prefix=f"{path}-L{latency:g}-c{conc}",
                        pids=[bridge.pid, fake.pid],
                    )
                    res["cpu_ms_per_op"] = _named(res["cpu_ms_per_op"], pids)
                    res["pids"] = pids
                    row[path] = res
                rows.append(row)
            if latency == self.args.latencies[0]:
                self.capabilities(fake, bridge)
                if not self.args.skip_ws:
                    self.ws_capabilities(fake, bridge)
            self.procs.stop(bridge)
            if latency == TARGET_LATENCY_MS and self.args.diagnostics:
                self.diagnostics(fake, rows[-len(grid) :])
            self.procs.stop(fake)
        self.results["turns"] = rows

    def capabilities(self, fake: Service, bridge: Service) -> None:
        out = {}
        for path, target in (("bridge", bridge), ("direct", fake)):
            res = self.cell(
                target,
                f"acp.capabilities c{CAPS_CONCURRENCY} {path}",
                kind="caps",
                concurrency=CAPS_CONCURRENCY,
                pids=[bridge.pid, fake.pid],
            )
            res["cpu_ms_per_op"] = _named(
                res["cpu_ms_per_op"], {"bridge": bridge.pid, "fake": fake.pid}
            )
            out[path] = res
        self.results["capabilities"] = out

    def ws_capabilities(self, fake: Service, bridge: Service) -> None:
        """acp.capabilities on one WebSocket per worker (bridge: with the bearer)."""
        out = {}
        for path, target in (("bridge", bridge), ("direct", fake)):
            res = self.cell(
                target,
                f"acp.capabilities WebSocket c{WS_CONCURRENCY} {path}",
                kind="ws_caps",
                url=target.ws_url,
                concurrency=WS_CONCURRENCY,
                pids=[bridge.pid, fake.pid],
            )
            res["cpu_ms_per_op"] = _named(
                res["cpu_ms_per_op"], {"bridge": bridge.pid, "fake": fake.pid}
            )
            out[path] = res
        self.results["ws_capabilities"] = out

    def streamed(self) -> None:
        """Turns whose upstream streams ``--stream-chunks`` deltas, read by the client as SSE."""
        chunks = self.args.stream_chunks
        fake = self.procs.start_fake(STREAM_LATENCY_MS, chunks)
        bridge = self.procs.start_bridge(fake, self.token)
        pids = {"bridge": bridge.pid, "fake": fake.pid}
        out = {}
        for path, target in (("direct", fake), ("bridge", bridge)):
            res = self.cell(
                target,
                f"streamed turns {STREAM_LATENCY_MS:g} ms c{STREAM_CONCURRENCY} "
                f"{chunks} chunks {path}",
                kind="stream",
                concurrency=STREAM_CONCURRENCY,
                prompt=stream_prompt(chunks),
                chunks=chunks,
                session_prefix=f"stream-{path}",
                pids=[bridge.pid, fake.pid],
            )
            res["cpu_ms_per_op"] = _named(res["cpu_ms_per_op"], pids)
            res["cpu_s_by_name"] = _named(res["cpu_s"], pids)
            res["pids"] = pids
            out[path] = res
        self.procs.stop(bridge)
        self.procs.stop(fake)
        self.results["streamed"] = out

    def diagnostics(self, fake: Service, rows: list[dict[str, Any]]) -> None:
        """Same 20 ms x 64 cell with one configuration change each, to attribute overhead."""
        reference = next((r for r in rows if r["concurrency"] == TARGET_CONCURRENCY), rows[0])
        conc = reference["concurrency"]
        variants: list[tuple[str, dict[str, Any] | None, str]] = [
            ("upstream plain JSON (providers[].stream: false)", _plain_upstream(fake), "info"),
            ("log level warning (no per-turn log line)", None, "warning"),
            ("both", _plain_upstream(fake), "warning"),
        ]
        out: list[dict[str, Any]] = []
        for name, config, level in variants:
            bridge = self.procs.start_bridge(fake, self.token, config=config, log_level=level)
            res = self.cell(
                bridge,
                f"diagnostic [{name}] c{conc}",
                kind="turn",
                concurrency=conc,
                session_prefix=f"diag-{len(out)}",
                pids=[bridge.pid, fake.pid],
            )
            res["cpu_ms_per_op"] = _named(
                res["cpu_ms_per_op"], {"bridge": bridge.pid, "fake": fake.pid}
            )
            out.append({"variant": name, "concurrency": conc, "result": res})
            self.procs.stop(bridge)
        self.results["diagnostics"] = {"reference": reference, "variants": out}

    def memory(self) -> None:
        args = self.args
        fake = self.procs.start_fake(0, args.chunks)
        config = {"limits": {"session_idle_ttl": 1, "max_queue_depth": 32}}
        bridge = self.procs.start_bridge(fake, self.token, config=config)
        keys = ("VmRSS", "VmHWM")
        phases: list[dict[str, Any]] = []

        def snap(phase: str, extra: dict[str, Any] | None = None) -> None:
            kib = status_kib(bridge.pid, *keys)
            phases.append({"phase": phase, **kib, **(extra or {})})
            log(
                f"memory {phase}: VmRSS {kib.get('VmRSS', 0) / MIB:.1f} MiB "
                f"VmHWM {kib.get('VmHWM', 0) / MIB:.1f} MiB"
            )

        def load(prefix: str, count: int) -> dict[str, Any]:
            return self.cell(
                bridge,
                f"memory load {prefix} ({count} sessions)",
                kind="turn",
                concurrency=args.mem_concurrency,
                count=count,
                session_prefix=prefix,
                pids=[bridge.pid, fake.pid],
            )

        time.sleep(0.5)
        snap("idle after start (cold)")
        warm = load("mem-warm", args.mem_concurrency * 4)
        time.sleep(args.reap_wait)
        snap("before: after warm-up, reaped")
        first = load("mem-a", args.threads)
        snap(f"right after {args.threads} sessions", {"load": first})
        time.sleep(args.reap_wait)
        snap(f"after {args.threads} sessions, reaped")
        second = load("mem-b", args.threads)
        time.sleep(args.reap_wait)
        snap(f"after 2nd {args.threads} sessions, reaped", {"load": second})
        self.procs.stop(bridge)
        self.procs.stop(fake)
        self.results["memory"] = {"phases": phases, "warmup": warm}

    def profile(self) -> None:
        """Optional: py-spy samples the daemon during the 20 ms x 64 cell."""
        pyspy = self.args.py_spy
        fake = self.procs.start_fake(TARGET_LATENCY_MS, self.args.chunks)
        bridge = self.procs.start_bridge(fake, self.token)
        out = self.procs.workdir / "bridge.collapsed"
        seconds = max(2, round(self.args.duration))
        cmd = [pyspy, "record", "--pid", str(bridge.pid), "--duration", str(seconds)]
        cmd += ["--rate", "250", "--gil", "--nonblocking", "--format", "raw", "--output", str(out)]
        with open(self.procs.workdir / "py-spy.log", "wb") as log:
            spy = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
            try:
                self.cell(
                    bridge,
                    "profiled turns 20 ms c64 bridge",
                    kind="turn",
                    concurrency=TARGET_CONCURRENCY,
                    warmup=0.5,
                    duration=seconds + 1.0,
                    session_prefix="prof",
                )
                spy.wait(timeout=30)
            finally:
                if spy.poll() is None:
                    spy.kill()
                    spy.wait()
        self.procs.stop(bridge)
        self.procs.stop(fake)
        if not out.exists():
            log_text = (self.procs.workdir / "py-spy.log").read_text(errors="replace")
            self.results["profile"] = {"error": log_text[-1000:]}
            return
        self.results["profile"] = hot_spots(out.read_text(errors="replace"))


def _named(per_pid: dict[str, float], names: dict[str, int]) -> dict[str, float]:
    by_pid = {str(pid): name for name, pid in names.items()}
    return {by_pid.get(pid, pid): value for pid, value in per_pid.items()}


def _plain_upstream(fake: Service) -> dict[str, Any]:
    return {
        "providers": [
            {
                "id": "codex",
                "label": "Codex",
                "endpoint": f"http://127.0.0.1:{fake.port}",
                "stream": False,
            }
        ]
    }


# --- command line --------------------------------------------------------------------------


def concurrency_grid(args: argparse.Namespace, latency: float) -> list[int]:
    """The client concurrencies of one upstream latency: ``--concurrency``, or by default
    1/64/256 at 0 ms and 16/64/256 otherwise (the 20 ms targets' cells)."""
    if args.concurrency:
        return list(args.concurrency)
    return [1, 64, 256] if latency == 0 else [16, 64, 256]


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m internal.bench.forwarding",
        description="Bridge vs. direct forwarding benchmark (loopback only).",
    )
    p.add_argument("--duration", type=float, default=4.0, help="measured seconds per cell")
    p.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds per cell")
    p.add_argument("--latencies", type=_floats, default=[0.0, 20.0], help="upstream ms, CSV")
    p.add_argument(
        "--concurrency",
        type=_ints,
        default=None,
        help="client concurrencies, CSV, for every latency (default: 1,64,256 at 0 ms and "
        "16,64,256 at other latencies)",
    )
    p.add_argument("--chunks", type=int, default=3, help="fake upstream delta chunks per turn")
    p.add_argument(
        "--stream-chunks",
        type=int,
        default=STREAM_CHUNKS,
        help="session.update deltas per turn in the streamed-turn cell",
    )
    p.add_argument("--threads", type=int, default=10_000, help="sessions in the memory phase")
    p.add_argument("--mem-concurrency", type=int, default=64)
    p.add_argument("--reap-wait", type=float, default=3.0, help="seconds to wait for reaping")
    p.add_argument(
        "--client",
        choices=("raw", "aiohttp"),
        default="raw",
        help="load generator HTTP client (raw asyncio HTTP/1.1 is cheaper per request)",
    )
    p.add_argument(
        "--quiet-threshold",
        type=float,
        default=0.15,
        help="before each cell, wait while processes not started by this run use more "
        "than this many cores (the machine may be shared)",
    )
    p.add_argument("--quiet-wait", type=float, default=10.0, help="max wait per cell, s")
    p.add_argument("--quiet-budget", type=float, default=60.0, help="max wait per run, s")
    p.add_argument("--no-diagnostics", dest="diagnostics", action="store_false")
    p.add_argument("--skip-turns", action="store_true")
    p.add_argument("--skip-memory", action="store_true")
    p.add_argument("--skip-stream", action="store_true", help="skip the streamed-turn cell")
    p.add_argument("--skip-ws", action="store_true", help="skip the WebSocket capabilities cell")
    p.add_argument(
        "--py-spy",
        metavar="PATH",
        help="also profile the daemon with this py-spy executable (a path, or a name on PATH)",
    )
    p.add_argument(
        "--bridge-launcher",
        metavar="SCRIPT",
        help="run the daemon as `python SCRIPT serve ...` instead of `python -m xwm_bridge "
        "serve ...` (A/B experiments with a patched build)",
    )
    p.add_argument("--json", metavar="FILE", help="write all raw results as JSON")
    p.add_argument("--keep-logs", action="store_true", help="keep the child processes' logs")
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 1 s cells, 0.3 s warm-up, 2000 sessions in the memory phase",
    )
    args = p.parse_args(argv)
    if args.py_spy:  # the profile runs last: a wrong path is refused before any cell
        found = shutil.which(args.py_spy)
        if found is None:
            p.error(f"--py-spy: no executable {args.py_spy!r} (pip install py-spy)")
        args.py_spy = found
    if args.quick:
        args.duration, args.warmup, args.threads = 1.0, 0.3, 2000
    return args


def machine_facts() -> dict[str, Any]:
    import aiohttp

    return {
        "nproc": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu": cpu_model(),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "aiohttp": aiohttp.__version__,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="xwm-bench-"))
    procs = Processes(workdir, bridge_launcher=args.bridge_launcher)
    started = time.monotonic()
    try:
        loadgen = LoadGen(procs, args.client)
        bench = Bench(args, procs, loadgen)
        bench.results["machine"] = machine_facts()
        if not args.skip_turns:
            bench.turns()
        if not args.skip_stream:
            bench.streamed()
        if not args.skip_memory:
            bench.memory()
        if args.py_spy:
            bench.profile()
        bench.results["elapsed_s"] = time.monotonic() - started
        bench.results["quiet_waited_s"] = bench.quiet_waited
        bench.results["targets"] = [t.as_dict() for t in evaluate(bench.results, args.threads)]
        print(report(bench.results, args))
        print(f"\n(total run time {bench.results['elapsed_s']:.0f} s)")
        if args.json:
            Path(args.json).write_text(json.dumps(bench.results, indent=1, default=str))
        return 0
    except BenchError as exc:
        log(f"failed: {exc} (logs in {workdir})")
        args.keep_logs = True
        return 1
    finally:
        procs.stop_all()
        if args.keep_logs:
            log(f"child logs kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
