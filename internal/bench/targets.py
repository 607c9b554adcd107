"""The targets of issue 11, computed from one run's results (measured, never asserted).

Every figure is a same-run ratio or difference: bridge against direct (the fake
upstream called without the bridge) in the same cell shape, or the bridge's CPU
against the fake's in the same bridge cell. :func:`evaluate` turns the results
dict that ``internal.bench.forwarding`` collects into :class:`Target` rows; a
row whose cell did not run says so (``n/a``), a figure the issue gives no
threshold for is printed as ``INFO``, and a cell with failed or unfinished
answers is a MISS whatever its numbers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

TARGET_LATENCY_MS = 20.0  # upstream latency of the target cells
TARGET_CONCURRENCY = 64  # the CPU-ratio cell and the diagnostics
CAPS_CONCURRENCY = 64  # acp.capabilities over HTTP
WS_CONCURRENCY = 16  # acp.capabilities on the WebSocket
STREAM_LATENCY_MS = 20.0  # streamed turn: the fake's --latency-ms
STREAM_CONCURRENCY = 64
STREAM_CHUNKS = 50  # session.update notifications per streamed turn

#: (concurrency, minimum bridge/direct turns/s, maximum added p50 in ms or None)
TURN_TARGETS: tuple[tuple[int, float, float | None], ...] = (
    (16, 0.95, 2.0),
    (64, 0.70, 10.0),
    (256, 0.50, None),
)
CPU_RATIO_MAX = 1.5  # bridge CPU per turn / fake CPU per turn, 20 ms x 64 bridge cell
CAPS_RATIO_MIN = 0.8  # acp.capabilities c64 bridge / direct
STREAM_CPU_RATIO_MAX = 1.5  # per relayed / per sent notification, same bridge cell
RSS_GROWTH_MAX = 0.10  # after N reaped sessions vs before


@dataclass(frozen=True, slots=True)
class Target:
    name: str
    #: the measured figure; None when its cell was not run
    value: float | None
    #: ">=" or "<=" against ``limit``; "within": ``abs(value) <= limit``; "info": no bound
    op: str = "info"
    limit: float = 0.0
    detail: str = ""
    #: failed + unfinished answers in the cells behind the figure (> 0: MISS)
    errors: int = 0
    fmt: str = ".2f"
    unit: str = ""

    @property
    def verdict(self) -> str:
        if self.value is None:
            return "n/a"
        if self.op == "info":
            return "INFO"
        if self.errors:
            return "MISS"
        v = self.value
        ok = {
            ">=": v >= self.limit,
            "<=": v <= self.limit,
            "within": abs(v) <= self.limit,
        }[self.op]  # NaN compares false: no answers is a MISS
        return "PASS" if ok else "MISS"

    def line(self) -> str:
        if self.value is None:
            return f"{'n/a':<4}  {self.name}: {self.detail or 'cell not run'}"
        bound = ""
        if self.op != "info":
            sign = {">=": "≥", "<=": "≤", "within": "within ±"}[self.op]
            bound = f" (target {sign} {format(self.limit, self.fmt.lstrip('+'))}{self.unit})"
        detail = f"  {self.detail}" if self.detail else ""
        errors = f"  [{self.errors} failed/unfinished answers]" if self.errors else ""
        value = format(self.value, self.fmt)
        return f"{self.verdict:<4}  {self.name}: {value}{self.unit}{bound}{detail}{errors}"

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["verdict"] = self.verdict
        return out


def _ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def _errs(*cells: dict[str, Any]) -> int:
    return sum(int(c.get("errors", 0)) + int(c.get("unfinished", 0)) for c in cells)


def per_notification_us(cell: dict[str, Any], process: str) -> float:
    """CPU µs of ``process`` (``bridge``/``fake``) per delta notification in a stream cell."""
    deltas = int(cell.get("deltas", 0))
    seconds = cell.get("cpu_s_by_name", {}).get(process)
    if not deltas or seconds is None:
        return float("nan")
    return 1e6 * float(seconds) / deltas


def _turn_row(results: dict[str, Any], concurrency: int) -> dict[str, Any] | None:
    for row in results.get("turns", []):
        if row["latency_ms"] == TARGET_LATENCY_MS and row["concurrency"] == concurrency:
            found: dict[str, Any] = row
            return found
    return None


def _turn_targets(results: dict[str, Any]) -> list[Target]:
    out: list[Target] = []
    lat = f"{TARGET_LATENCY_MS:g} ms"
    for conc, min_ratio, max_added in TURN_TARGETS:
        row = _turn_row(results, conc)
        name = f"{lat} x {conc}: bridge turns/s ÷ direct"
        if row is None:
            out.append(Target(name, None))
            if max_added is not None:
                out.append(Target(f"{lat} x {conc}: added p50", None))
            continue
        d, b = row["direct"], row["bridge"]
        errors = _errs(d, b)
        out.append(
            Target(
                name,
                _ratio(b["per_s"], d["per_s"]),
                ">=",
                min_ratio,
                f"({b['per_s']:.0f} vs {d['per_s']:.0f} turns/s)",
                errors,
            )
        )
        if max_added is not None:
            out.append(
                Target(
                    f"{lat} x {conc}: added p50",
                    b["p50_ms"] - d["p50_ms"],
                    "<=",
                    max_added,
                    f"({b['p50_ms']:.2f} vs {d['p50_ms']:.2f} ms)",
                    errors,
                    fmt="+.2f",
                    unit=" ms",
                )
            )
    row = _turn_row(results, TARGET_CONCURRENCY)
    name = f"{lat} x {TARGET_CONCURRENCY} bridge cell: bridge CPU per turn ÷ fake CPU per turn"
    if row is None:
        out.append(Target(name, None))
    else:
        b = row["bridge"]
        bridge_ms = b["cpu_ms_per_op"].get("bridge", float("nan"))
        fake_ms = b["cpu_ms_per_op"].get("fake", float("nan"))
        out.append(
            Target(
                name,
                _ratio(bridge_ms, fake_ms),
                "<=",
                CPU_RATIO_MAX,
                f"(bridge {bridge_ms:.3f} ms, fake {fake_ms:.3f} ms per turn)",
                _errs(b),
            )
        )
    return out


def _capability_targets(results: dict[str, Any]) -> list[Target]:
    out: list[Target] = []
    caps = results.get("capabilities")
    name = f"acp.capabilities c{CAPS_CONCURRENCY} (HTTP): bridge req/s ÷ direct fake"
    if not caps:
        out.append(Target(name, None))
    else:
        b, d = caps["bridge"], caps["direct"]
        out.append(
            Target(
                name,
                _ratio(b["per_s"], d["per_s"]),
                ">=",
                CAPS_RATIO_MIN,
                f"({b['per_s']:.0f} vs {d['per_s']:.0f} req/s)",
                _errs(b, d),
            )
        )
    ws = results.get("ws_capabilities")
    name = f"acp.capabilities c{WS_CONCURRENCY} on the WebSocket: bridge req/s ÷ direct fake"
    if not ws:
        out.append(Target(name, None))
    else:
        b, d = ws["bridge"], ws["direct"]
        detail = f"({b['per_s']:.0f} vs {d['per_s']:.0f} req/s; no threshold in the issue)"
        errors = _errs(b, d)
        if errors:
            detail += f" [{errors} failed/unfinished answers]"
        out.append(Target(name, _ratio(b["per_s"], d["per_s"]), detail=detail))
    return out


def _stream_targets(results: dict[str, Any]) -> list[Target]:
    stream = results.get("streamed")
    shape = (
        f"streamed turn ({STREAM_LATENCY_MS:g} ms x {STREAM_CONCURRENCY}, {STREAM_CHUNKS} chunks)"
    )
    cpu_name = f"{shape}: bridge CPU per relayed notification ÷ fake CPU per sent notification"
    first_name = f"{shape}: added first-chunk p50"
    if not stream:
        return [Target(cpu_name, None), Target(first_name, None)]
    b, d = stream["bridge"], stream["direct"]
    bridge_us = per_notification_us(b, "bridge")
    fake_us = per_notification_us(b, "fake")
    cpu = Target(
        cpu_name,
        _ratio(bridge_us, fake_us),
        "<=",
        STREAM_CPU_RATIO_MAX,
        f"(bridge {bridge_us:.1f} µs, fake {fake_us:.1f} µs per notification, bridge cell)",
        _errs(b),
    )
    added = b["first_chunk_p50_ms"] - d["first_chunk_p50_ms"]
    errors = _errs(b, d)
    first = Target(
        first_name,
        added,
        detail=f"({b['first_chunk_p50_ms']:.2f} vs {d['first_chunk_p50_ms']:.2f} ms; "
        "no threshold in the issue)" + (f" [{errors} failed/unfinished answers]" if errors else ""),
        fmt="+.2f",
        unit=" ms",
    )
    return [cpu, first]


def _memory_target(results: dict[str, Any], threads: int) -> Target:
    name = f"RSS after {threads} reaped sessions vs before"
    mem = results.get("memory")
    if not mem or len(mem.get("phases", [])) < 4:
        return Target(name, None)
    phases = mem["phases"]
    before, after = phases[1].get("VmRSS", 0), phases[3].get("VmRSS", 0)
    cold = phases[0].get("VmRSS", 0)
    growth = 100 * (after - before) / before if before else float("nan")
    vs_cold = 100 * (after - cold) / cold if cold else float("nan")
    loads = [p["load"] for p in phases if "load" in p]
    return Target(
        name,
        growth,
        "within",
        100 * RSS_GROWTH_MAX,
        f"({after / 1024:.1f} vs {before / 1024:.1f} MiB; vs cold start "
        f"{cold / 1024:.1f} MiB: {vs_cold:+.1f}%)",
        _errs(*loads),
        fmt="+.1f",
        unit="%",
    )


def evaluate(results: dict[str, Any], threads: int) -> list[Target]:
    """Every target of issue 11 (and the information-only figures) for one run."""
    return [
        *_turn_targets(results),
        *_capability_targets(results),
        *_stream_targets(results),
        _memory_target(results, threads),
    ]
