"""Text report of the forwarding benchmark: tables, targets (PASS/MISS), profile summary."""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MIB = 1024

# targets from the issue
TARGET_LATENCY_MS = 20.0
TARGET_CONCURRENCY = 64
TARGET_THROUGHPUT_RATIO = 0.90
TARGET_ADDED_P50_MS = 2.0
TARGET_RSS_GROWTH = 0.10


# --- py-spy collapsed stacks --------------------------------------------------------------


def hot_spots(collapsed: str, top: int = 20) -> dict[str, Any]:
    """Self and inclusive sample shares per function from py-spy's collapsed stacks."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    groups: Counter[str] = Counter()
    total = 0
    for line in collapsed.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [_short_frame(f) for f in stack.split(";")]
        total += count
        own[frames[-1]] += count
        groups[_subsystem(frames[-1])] += count
        for frame in set(frames):
            inclusive[frame] += count
    share = 100.0 / max(1, total)
    return {
        "samples": total,
        "self": [(name, n * share) for name, n in own.most_common(top)],
        "inclusive": [(name, n * share) for name, n in inclusive.most_common(top * 2)],
        "subsystems": [(name, n * share) for name, n in groups.most_common()],
    }


_SUBSYSTEMS = (
    ("xwm_bridge/", "xwm_bridge (bridge logic)"),
    ("concurrent/futures/", "thread pool (asyncio.to_thread)"),
    ("asyncio/threads.py", "thread pool (asyncio.to_thread)"),
    ("threading.py", "thread pool (asyncio.to_thread)"),
    ("aiohttp/client", "aiohttp client (upstream calls)"),
    ("aiohttp/connector", "aiohttp client (upstream calls)"),
    ("aiohttp/web", "aiohttp server (client requests)"),
    ("aiohttp/", "aiohttp shared (parsers, streams, helpers)"),
    ("asyncio/", "asyncio event loop and transports"),
    ("selectors.py", "asyncio event loop and transports"),
    ("logging/", "logging (stdlib)"),
)


def _subsystem(frame: str) -> str:
    """Group a leaf frame 'fn (pkg/mod.py)' by the library it runs in."""
    for marker, name in _SUBSYSTEMS:
        if marker in frame:
            return name
    return "other (orjson, yarl, multidict, stdlib)"


def _short_frame(frame: str) -> str:
    """'fn (/long/path/pkg/mod.py:12)' -> 'fn (pkg/mod.py)': line numbers merge."""
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    for marker in ("/site-packages/", "/lib/python3.11/", str(ROOT) + "/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{name} ({path})" if path else name


# --- report --------------------------------------------------------------------------------


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def _fmt(value: float, spec: str = ".2f") -> str:
    return "n/a" if value != value else format(value, spec)  # NaN check


def report(results: dict[str, Any], args: argparse.Namespace) -> str:
    out: list[str] = []
    facts = results["machine"]
    out.append("xwm-bridge forwarding benchmark")
    out.append(
        f"machine: nproc={facts['nproc']} cpu={facts['cpu']} python={facts['python']} "
        f"aiohttp={facts['aiohttp']} loop=asyncio (default)"
        + (f" bridge launcher={args.bridge_launcher}" if args.bridge_launcher else "")
    )
    out.append(
        f"method: {args.duration:g} s per cell after {args.warmup:g} s warm-up; closed loop; "
        f"load generator in its own process (client={args.client}); fake upstream "
        f"--chunks {args.chunks}; bridge, fake and client share all {facts['nproc']} cores"
    )
    out.append("")
    rows = results.get("turns", [])
    if rows:
        out.append("1. session.message turns, plain JSON POST /acp/rpc (latencies in ms)")
        header = (
            f"{'upstream':>8} {'conc':>4} | {'direct/s':>8} {'p50':>6} {'p99':>7} | "
            f"{'bridge/s':>8} {'p50':>6} {'p99':>7} | {'ratio':>5} {'+p50':>6} {'+p99':>7} | "
            f"{'CPU ms/turn: bridge':>19} {'fake d/b':>9} {'client d/b':>10} | "
            f"{'bridge cores':>12} {'other':>5} | errs"
        )
        out.append(header)
        out.append("-" * len(header))
        for row in rows:
            d, b = row["direct"], row["bridge"]
            ratio = b["per_s"] / d["per_s"] if d["per_s"] else float("nan")
            errs = d["errors"] + b["errors"] + d["unfinished"] + b["unfinished"]
            out.append(
                f"{row['latency_ms']:>6g}ms {row['concurrency']:>4} | "
                f"{d['per_s']:>8.0f} {_fmt(d['p50_ms']):>6} {_fmt(d['p99_ms']):>7} | "
                f"{b['per_s']:>8.0f} {_fmt(b['p50_ms']):>6} {_fmt(b['p99_ms']):>7} | "
                f"{_fmt(ratio):>5} {_fmt(b['p50_ms'] - d['p50_ms']):>6} "
                f"{_fmt(b['p99_ms'] - d['p99_ms']):>7} | "
                f"{b['cpu_ms_per_op'].get('bridge', 0):>19.3f} "
                f"{d['cpu_ms_per_op'].get('fake', 0):>4.2f}/"
                f"{b['cpu_ms_per_op'].get('fake', 0):<4.2f} "
                f"{d['client_cpu_ms_per_op']:>5.2f}/{b['client_cpu_ms_per_op']:<4.2f} | "
                f"{b['cpu_s'].get(str(b['pids']['bridge']), 0.0) / b['window_s']:>12.2f} "
                f"{max(d['other_cores'], b['other_cores']):>5.2f} | {errs}"
            )
        out.append(
            "   ratio = bridge/direct turns/s; +p50/+p99 = latency the bridge adds; CPU = "
            "process CPU per completed turn (d = direct cell, b = bridge cell);"
        )
        out.append(
            "   bridge cores = the daemon's CPU use during the bridge cell; other = cores used "
            "by processes this run did not start (shared machine); errs = errors + unfinished"
        )
        out.append("")
    caps = results.get("capabilities")
    if caps:
        out.append("2. acp.capabilities, concurrency 64")
        for path in ("bridge", "direct"):
            r = caps[path]
            cpu = r["cpu_ms_per_op"].get("bridge" if path == "bridge" else "fake", 0.0)
            out.append(
                f"   {path + (' (fake, reference)' if path == 'direct' else ''):<26} "
                f"{r['per_s']:>7.0f} req/s  p50 {_fmt(r['p50_ms'])} ms  "
                f"p99 {_fmt(r['p99_ms'])} ms  server CPU {cpu:.3f} ms/req  "
                f"errors {r['errors'] + r['unfinished']}"
            )
        out.append("")
    diag = results.get("diagnostics")
    if diag:
        ref = diag["reference"]
        direct = ref["direct"]
        out.append(
            f"   diagnostics at {TARGET_LATENCY_MS:g} ms upstream, concurrency "
            f"{ref['concurrency']} (direct: {direct['per_s']:.0f}/s p50 "
            f"{_fmt(direct['p50_ms'])} ms)"
        )
        entries = [("default config (row above)", ref["bridge"])]
        entries += [(v["variant"], v["result"]) for v in diag["variants"]]
        for name, r in entries:
            ratio = r["per_s"] / direct["per_s"] if direct["per_s"] else float("nan")
            out.append(
                f"   {name:<50} {r['per_s']:>6.0f}/s ratio {_fmt(ratio)} "
                f"+p50 {_fmt(r['p50_ms'] - direct['p50_ms'])} ms  "
                f"bridge CPU {r['cpu_ms_per_op'].get('bridge', 0):.3f} ms/turn  "
                f"fake CPU {r['cpu_ms_per_op'].get('fake', 0):.3f} ms/turn  "
                f"other {r['other_cores']:.2f}"
            )
        out.append("")
    mem = results.get("memory")
    if mem:
        out.append(
            f"3. daemon memory, {args.threads} distinct sessions/threads (one turn each, "
            f"concurrency {args.mem_concurrency}), limits.session_idle_ttl 1 s, "
            f"{args.reap_wait:g} s wait to reap"
        )
        for p in mem["phases"]:
            load = p.get("load")
            extra = (
                f"   ({load['per_s']:.0f} turns/s, errors {load['errors']}, "
                f"other {load['other_cores']:.2f})"
                if load
                else ""
            )
            out.append(
                f"   {p['phase']:<40} VmRSS {p.get('VmRSS', 0) / MIB:>7.1f} MiB   "
                f"VmHWM {p.get('VmHWM', 0) / MIB:>7.1f} MiB{extra}"
            )
        out.append("")
    others = _all_other_loads(results)
    if others and max(others) > 0.2:
        out.append(
            f"WARNING: other processes used up to {max(others):.2f} cores during a cell "
            f"(waited {results.get('quiet_waited_s', 0):.0f} s for quiet): numbers are "
            "pessimistic; rerun on an idle machine"
        )
    out.append("Targets (from the issue; measured, not asserted)")
    for line in targets(results, args):
        out.append("   " + line)
    if "profile" in results:
        out.append("")
        out.extend(_profile_lines(results["profile"]))
    return "\n".join(out)


def _all_other_loads(results: dict[str, Any]) -> list[float]:
    out = [r[p]["other_cores"] for r in results.get("turns", []) for p in ("direct", "bridge")]
    out += [r["other_cores"] for r in results.get("capabilities", {}).values()]
    diag = results.get("diagnostics")
    if diag:
        out += [v["result"]["other_cores"] for v in diag["variants"]]
    for phase in results.get("memory", {}).get("phases", []):
        if "load" in phase:
            out.append(phase["load"]["other_cores"])
    return out


def targets(results: dict[str, Any], args: argparse.Namespace) -> list[str]:
    lines: list[str] = []
    row = next(
        (
            r
            for r in results.get("turns", [])
            if r["latency_ms"] == TARGET_LATENCY_MS and r["concurrency"] == TARGET_CONCURRENCY
        ),
        None,
    )
    if row is None:
        lines.append("throughput / latency targets: cell 20 ms x 64 not run")
    else:
        d, b = row["direct"], row["bridge"]
        ratio = b["per_s"] / d["per_s"] if d["per_s"] else 0.0
        added = b["p50_ms"] - d["p50_ms"]
        lines.append(
            f"{_verdict(ratio >= TARGET_THROUGHPUT_RATIO)}  bridge throughput >= 90% of direct "
            f"at 20 ms x 64: {100 * ratio:.1f}% ({b['per_s']:.0f} vs {d['per_s']:.0f} turns/s)"
        )
        lines.append(
            f"{_verdict(added <= TARGET_ADDED_P50_MS)}  added p50 <= 2 ms at 20 ms x 64: "
            f"{added:+.2f} ms ({b['p50_ms']:.2f} vs {d['p50_ms']:.2f} ms)"
        )
    mem = results.get("memory")
    if mem:
        phases = mem["phases"]
        before, after = phases[1].get("VmRSS", 0), phases[3].get("VmRSS", 0)
        cold = phases[0].get("VmRSS", 0)
        growth = after / before - 1 if before else float("inf")
        lines.append(
            f"{_verdict(abs(growth) <= TARGET_RSS_GROWTH)}  RSS after {args.threads} "
            f"sessions (reaped) within 10% of before: {after / MIB:.1f} vs {before / MIB:.1f} "
            f"MiB = {100 * growth:+.1f}% (vs cold start {cold / MIB:.1f} MiB: "
            f"{100 * (after / cold - 1) if cold else float('nan'):+.1f}%)"
        )
    return lines


def _profile_lines(profile: dict[str, Any]) -> list[str]:
    if "error" in profile:
        return [f"py-spy profile failed: {profile['error']}"]
    lines = [
        f"py-spy profile of the daemon, 20 ms x 64 ({profile['samples']} samples, "
        "threads holding the GIL)"
    ]
    lines.append("   self time by subsystem:")
    lines += [f"   {share:5.1f}%  {name}" for name, share in profile["subsystems"]]
    lines.append("   self time by function:")
    lines += [f"   {share:5.1f}%  {name}" for name, share in profile["self"]]
    lines.append("   inclusive (xwm_bridge frames):")
    lines += [
        f"   {share:5.1f}%  {name}" for name, share in profile["inclusive"] if "xwm_bridge/" in name
    ]
    return lines
