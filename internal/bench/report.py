"""Text report of the forwarding benchmark: tables, targets (PASS/MISS), profile summary."""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path
from typing import Any

from internal.bench.targets import (
    CAPS_CONCURRENCY,
    STREAM_CHUNKS,
    STREAM_CONCURRENCY,
    STREAM_LATENCY_MS,
    TARGET_LATENCY_MS,
    WS_CONCURRENCY,
    evaluate,
    per_notification_us,
)

ROOT = Path(__file__).resolve().parents[2]
MIB = 1024


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
    out.extend(_capability_lines(results))
    out.extend(_stream_lines(results))
    mem = results.get("memory")
    if mem:
        out.append(
            f"4. daemon memory, {args.threads} distinct sessions/threads (one turn each, "
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
    out.append("Targets (issue 11; same-run figures, measured, never asserted)")
    for target in evaluate(results, args.threads):
        out.append("   " + target.line())
    if "profile" in results:
        out.append("")
        out.extend(_profile_lines(results["profile"]))
    return "\n".join(out)


def _capability_lines(results: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for key, title in (
        (
            "capabilities",
            f"acp.capabilities, plain JSON POST /acp/rpc, concurrency {CAPS_CONCURRENCY}",
        ),
        (
            "ws_capabilities",
            f"acp.capabilities on the WebSocket GET /acp, concurrency {WS_CONCURRENCY} "
            "(one connection per worker, closed loop)",
        ),
    ):
        cells = results.get(key)
        if not cells:
            continue
        if not out:
            out.append("2. " + title)
        else:
            out.append("   " + title)
        for path in ("bridge", "direct"):
            r = cells[path]
            cpu = r["cpu_ms_per_op"].get("bridge" if path == "bridge" else "fake", 0.0)
            out.append(
                f"   {path + (' (fake, reference)' if path == 'direct' else ''):<26} "
                f"{r['per_s']:>7.0f} req/s  p50 {_fmt(r['p50_ms'])} ms  "
                f"p99 {_fmt(r['p99_ms'])} ms  server CPU {cpu:.3f} ms/req  "
                f"client CPU {r['client_cpu_ms_per_op']:.3f} ms/req  "
                f"errors {r['errors'] + r['unfinished']}  other {r['other_cores']:.2f}"
            )
        b, d = cells["bridge"], cells["direct"]
        ratio = b["per_s"] / d["per_s"] if d["per_s"] else float("nan")
        out.append(f"   {'bridge ÷ direct':<26} {_fmt(ratio):>7}")
    if out:
        out.append("")
    return out


def _stream_lines(results: dict[str, Any]) -> list[str]:
    stream = results.get("streamed")
    if not stream:
        return []
    out = [
        f"3. streamed turn: session.message with Accept: text/event-stream, fake upstream "
        f"--latency-ms {STREAM_LATENCY_MS:g} --chunks {STREAM_CHUNKS}, concurrency "
        f"{STREAM_CONCURRENCY} (latencies in ms)"
    ]
    header = (
        f"   {'path':<7} {'turns/s':>7} {'p50':>7} {'p99':>7} | {'1st chunk p50':>13} "
        f"{'p99':>7} {'1st event p50':>13} | {'notif/turn':>10} | "
        f"{'CPU µs/notification: bridge':>27} {'fake':>6} {'client':>6} | {'other':>5} | errs"
    )
    out.append(header)
    for path in ("direct", "bridge"):
        r = stream[path]
        done = max(1, r["completed"])
        bridge_us = per_notification_us(r, "bridge") if path == "bridge" else float("nan")
        client_us = 1e6 * r["client_cpu_s"] / r["deltas"] if r["deltas"] else float("nan")
        out.append(
            f"   {path:<7} {r['per_s']:>7.0f} {_fmt(r['p50_ms']):>7} {_fmt(r['p99_ms']):>7} | "
            f"{_fmt(r['first_chunk_p50_ms']):>13} {_fmt(r['first_chunk_p99_ms']):>7} "
            f"{_fmt(r['first_event_p50_ms']):>13} | "
            f"{r['notifications'] / done:>10.1f} | "
            f"{_fmt(bridge_us, '.1f'):>27} {_fmt(per_notification_us(r, 'fake'), '.1f'):>6} "
            f"{_fmt(client_us, '.1f'):>6} | {r['other_cores']:>5.2f} | "
            f"{r['errors'] + r['unfinished']}"
        )
    b, d = stream["bridge"], stream["direct"]
    ratio = b["per_s"] / d["per_s"] if d["per_s"] else float("nan")
    out.append(
        f"   bridge ÷ direct turns/s {_fmt(ratio)}; added first-chunk p50 "
        f"{_fmt(b['first_chunk_p50_ms'] - d['first_chunk_p50_ms'], '+.2f')} ms; added p50 "
        f"{_fmt(b['p50_ms'] - d['p50_ms'], '+.2f')} ms"
    )
    out.append(
        "   1st chunk = first delta session.update (bridge: the first relayed upstream frame); "
        "1st event = first data: event (bridge: its own 'started' status update);"
    )
    out.append(
        "   notif/turn = notifications per answer (bridge: 50 relayed + its status update); "
        "CPU per delta notification received by the client"
    )
    out.append("")
    return out


def _all_other_loads(results: dict[str, Any]) -> list[float]:
    out = [r[p]["other_cores"] for r in results.get("turns", []) for p in ("direct", "bridge")]
    for section in ("capabilities", "ws_capabilities", "streamed"):
        out += [r["other_cores"] for r in results.get(section, {}).values()]
    diag = results.get("diagnostics")
    if diag:
        out += [v["result"]["other_cores"] for v in diag["variants"]]
    for phase in results.get("memory", {}).get("phases", []):
        if "load" in phase:
            out.append(phase["load"]["other_cores"])
    return out


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
