"""internal.bench.targets: issue 11's PASS/MISS lines from one run's results."""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Any

import pytest

from internal.bench.forwarding import concurrency_grid, parse_args
from internal.bench.targets import Target, evaluate, per_notification_us


def _cell(per_s: float, p50: float = 22.0, **extra: Any) -> dict[str, Any]:
    cell = {"per_s": per_s, "p50_ms": p50, "errors": 0, "unfinished": 0}
    cell.update(extra)
    return cell


def _row(conc: int, direct: float, bridge: float, d50: float, b50: float) -> dict[str, Any]:
    return {
        "latency_ms": 20.0,
        "concurrency": conc,
        "direct": _cell(direct, d50, cpu_ms_per_op={"fake": 0.10}),
        "bridge": _cell(bridge, b50, cpu_ms_per_op={"bridge": 0.14, "fake": 0.10}),
    }


def _results() -> dict[str, Any]:
    """A run in which every target passes."""
    return {
        "turns": [
            {**_row(64, 1000, 990, 20.0, 20.5), "latency_ms": 0.0},  # not a target cell
            _row(16, 720, 700, 21.0, 22.5),
            _row(64, 2800, 2000, 22.0, 31.0),
            _row(256, 10000, 5000, 22.0, 60.0),
        ],
        "capabilities": {"bridge": _cell(24000), "direct": _cell(28000)},
        "ws_capabilities": {"bridge": _cell(18000), "direct": _cell(24000)},
        "streamed": {
            "direct": _cell(2300, first_chunk_p50_ms=26.0, deltas=2300 * 50),
            "bridge": _cell(
                1000,
                first_chunk_p50_ms=29.5,
                deltas=50_000,
                # µs per notification: bridge 12, fake 10
                cpu_s_by_name={"bridge": 0.6, "fake": 0.5},
            ),
        },
        "memory": {
            "phases": [
                {"VmRSS": 60_000},
                {"VmRSS": 64_000},
                {"VmRSS": 70_000, "load": _cell(1800)},
                {"VmRSS": 70_000},
                {"VmRSS": 70_500, "load": _cell(1800)},
            ]
        },
    }


def _by_name(results: dict[str, Any]) -> dict[str, Target]:
    return {t.name: t for t in evaluate(results, 10_000)}


def _verdicts(results: dict[str, Any]) -> dict[str, str]:
    return {name: t.verdict for name, t in _by_name(results).items()}


def test_every_figure_of_the_issue_table_is_evaluated() -> None:
    verdicts = _verdicts(_results())
    assert verdicts == {
        "20 ms x 16: bridge turns/s ÷ direct": "PASS",
        "20 ms x 16: added p50": "PASS",
        "20 ms x 64: bridge turns/s ÷ direct": "PASS",
        "20 ms x 64: added p50": "PASS",
        "20 ms x 256: bridge turns/s ÷ direct": "PASS",
        "20 ms x 64 bridge cell: bridge CPU per turn ÷ fake CPU per turn": "PASS",
        "acp.capabilities c64 (HTTP): bridge req/s ÷ direct fake": "PASS",
        "acp.capabilities c16 on the WebSocket: bridge req/s ÷ direct fake": "INFO",
        "streamed turn (20 ms x 64, 50 chunks): bridge CPU per relayed notification "
        "÷ fake CPU per sent notification": "PASS",
        "streamed turn (20 ms x 64, 50 chunks): added first-chunk p50": "INFO",
        "RSS after 10000 reaped sessions vs before": "PASS",
    }


def test_measured_values_are_same_run_ratios() -> None:
    t = _by_name(_results())
    assert t["20 ms x 16: bridge turns/s ÷ direct"].value == pytest.approx(700 / 720)
    assert t["20 ms x 64: added p50"].value == pytest.approx(9.0)
    cpu = t["20 ms x 64 bridge cell: bridge CPU per turn ÷ fake CPU per turn"]
    assert cpu.value == pytest.approx(1.4)
    assert "bridge 0.140 ms, fake 0.100 ms per turn" in cpu.line()
    stream = next(v for k, v in t.items() if "relayed notification" in k)
    assert stream.value == pytest.approx(1.2)
    assert "bridge 12.0 µs, fake 10.0 µs" in stream.line()
    added = t["streamed turn (20 ms x 64, 50 chunks): added first-chunk p50"]
    assert added.value == pytest.approx(3.5)
    assert t["RSS after 10000 reaped sessions vs before"].value == pytest.approx(9.375)


@pytest.mark.parametrize(("bridge", "verdict"), [(684, "PASS"), (683, "MISS")])  # 0.95 x 720 = 684
def test_throughput_bound_is_inclusive(bridge: float, verdict: str) -> None:
    results = _results()
    results["turns"][1]["bridge"]["per_s"] = bridge
    assert _verdicts(results)["20 ms x 16: bridge turns/s ÷ direct"] == verdict


@pytest.mark.parametrize(("b50", "verdict"), [(31.99, "PASS"), (32.01, "MISS")])
def test_added_p50_bound(b50: float, verdict: str) -> None:
    results = _results()
    results["turns"][2]["bridge"]["p50_ms"] = b50
    assert _verdicts(results)["20 ms x 64: added p50"] == verdict


def test_cpu_ratios_above_the_bound_miss() -> None:
    results = _results()
    results["turns"][2]["bridge"]["cpu_ms_per_op"]["bridge"] = 0.151
    results["streamed"]["bridge"]["cpu_s_by_name"]["bridge"] = 0.76  # 15.2 µs vs 10
    verdicts = _verdicts(results)
    assert verdicts["20 ms x 64 bridge cell: bridge CPU per turn ÷ fake CPU per turn"] == "MISS"
    stream = next(v for k, v in verdicts.items() if "relayed notification" in k)
    assert stream == "MISS"


@pytest.mark.parametrize(
    ("after", "verdict"), [(70_400, "PASS"), (70_401, "MISS"), (57_000, "MISS")]
)
def test_rss_must_stay_within_ten_percent_either_way(after: int, verdict: str) -> None:
    results = _results()
    results["memory"]["phases"][3]["VmRSS"] = after
    assert _verdicts(results)["RSS after 10000 reaped sessions vs before"] == verdict


def test_failed_answers_make_a_miss_whatever_the_numbers() -> None:
    results = _results()
    results["turns"][1]["bridge"]["errors"] = 1
    results["capabilities"]["direct"]["unfinished"] = 2
    t = _by_name(results)
    assert t["20 ms x 16: added p50"].verdict == "MISS"
    caps = t["acp.capabilities c64 (HTTP): bridge req/s ÷ direct fake"]
    assert caps.verdict == "MISS"
    assert "[2 failed/unfinished answers]" in caps.line()


def test_no_answers_is_a_miss_not_a_pass() -> None:
    results = _results()
    results["turns"][2]["direct"]["per_s"] = 0
    results["streamed"]["bridge"]["deltas"] = 0
    t = _by_name(results)
    ratio = t["20 ms x 64: bridge turns/s ÷ direct"]
    assert math.isnan(ratio.value or 0.0) and ratio.verdict == "MISS"
    stream = next(v for k, v in t.items() if "relayed notification" in k)
    assert stream.verdict == "MISS"


def test_cells_not_run_say_so() -> None:
    t = evaluate({"turns": []}, 2000)
    assert {x.verdict for x in t} == {"n/a"}
    assert len(t) == 11
    assert t[0].line() == "n/a   20 ms x 16: bridge turns/s ÷ direct: cell not run"


def test_line_shows_value_bound_and_detail() -> None:
    t = _by_name(_results())
    assert t["20 ms x 64: added p50"].line() == (
        "PASS  20 ms x 64: added p50: +9.00 ms (target ≤ 10.00 ms)  (31.00 vs 22.00 ms)"
    )
    assert (
        t["RSS after 10000 reaped sessions vs before"]
        .line()
        .startswith(
            "PASS  RSS after 10000 reaped sessions vs before: +9.4% (target within ± 10.0%)"
        )
    )
    assert t["acp.capabilities c16 on the WebSocket: bridge req/s ÷ direct fake"].line() == (
        "INFO  acp.capabilities c16 on the WebSocket: bridge req/s ÷ direct fake: 0.75  "
        "(18000 vs 24000 req/s; no threshold in the issue)"
    )


def test_as_dict_carries_the_verdict_for_json() -> None:
    row = evaluate(_results(), 10_000)[0].as_dict()
    assert row["verdict"] == "PASS" and row["op"] == ">=" and row["limit"] == 0.95


def test_per_notification_us_needs_deltas_and_the_process() -> None:
    cell = {"deltas": 1000, "cpu_s_by_name": {"bridge": 0.02}}
    assert per_notification_us(cell, "bridge") == pytest.approx(20.0)
    assert math.isnan(per_notification_us(cell, "fake"))
    assert math.isnan(per_notification_us({"deltas": 0}, "bridge"))


def test_default_concurrency_grid_per_latency_and_override() -> None:
    args = parse_args(["--quick"])
    assert concurrency_grid(args, 0.0) == [1, 64, 256]
    assert concurrency_grid(args, 20.0) == [16, 64, 256]
    args = parse_args(["--quick", "--latencies", "20", "--concurrency", "16,64,256"])
    assert args.latencies == [20.0]
    assert concurrency_grid(args, 20.0) == [16, 64, 256]
    assert concurrency_grid(parse_args(["--concurrency", "8"]), 0.0) == [8]
    assert parse_args([]).stream_chunks == 50


def _full(cell: dict[str, Any], pids: dict[str, int]) -> dict[str, Any]:
    """A cell with every key the loadgen and forwarding.py put in one."""
    full = {
        "completed": 100,
        "p99_ms": 40.0,
        "window_s": 1.0,
        "cpu_s": {str(pid): 0.1 for pid in pids.values()},
        "cpu_ms_per_op": {"bridge": 0.2, "fake": 0.1},
        "client_cpu_s": 0.05,
        "client_cpu_ms_per_op": 0.03,
        "other_cores": 0.0,
        "pids": pids,
        "first_chunk_p50_ms": 25.0,
        "first_chunk_p99_ms": 30.0,
        "first_event_p50_ms": 5.0,
        "notifications": 5100,
        "deltas": 5000,
        "cpu_s_by_name": {"bridge": 0.06, "fake": 0.05},
    }
    full.update(cell)
    return full


def test_the_report_prints_every_section_and_the_targets() -> None:
    from internal.bench.report import report

    pids = {"bridge": 11, "fake": 12}
    results = _results()
    for row in results["turns"]:
        row["direct"] = _full(row["direct"], pids)
        row["bridge"] = _full(row["bridge"], pids)
    for key in ("capabilities", "ws_capabilities", "streamed"):
        results[key] = {path: _full(c, pids) for path, c in results[key].items()}
    for n, phase in enumerate(results["memory"]["phases"]):
        phase["phase"] = f"phase {n}"
        if "load" in phase:
            phase["load"]["other_cores"] = 0.0
    results["machine"] = {"nproc": 2, "cpu": "test", "python": "3.11", "aiohttp": "x"}
    text = report(results, parse_args(["--quick"]))
    assert "1. session.message turns" in text
    assert "2. acp.capabilities, plain JSON POST /acp/rpc, concurrency 64" in text
    assert "acp.capabilities on the WebSocket GET /acp, concurrency 16" in text
    assert "3. streamed turn" in text and "4. daemon memory" in text
    assert "added first-chunk p50 +3.50 ms" in text
    for target in evaluate(results, 2000):
        assert target.line() in text


def test_py_spy_is_looked_up_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the profile runs after every cell: a wrong path used to end a whole run in a
    # FileNotFoundError traceback; it is refused at once, with the fix
    missing = tmp_path / "no-such-py-spy"
    with pytest.raises(SystemExit) as exited:
        parse_args(["--py-spy", str(missing)])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"--py-spy: no executable {str(missing)!r}" in err and "pip install py-spy" in err
    spy = tmp_path / "py-spy"
    spy.write_text("#!/bin/sh\n")
    spy.chmod(0o755)
    assert parse_args(["--py-spy", str(spy)]).py_spy == str(spy)
    # a bare name is found on PATH, as the shell would
    assert parse_args(["--py-spy", "sh"]).py_spy == shutil.which("sh")
