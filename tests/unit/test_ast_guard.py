"""tests/ast_guard.py: a failing test that leaves a task with an unretrieved exception
behind gets its ordinary report, not ``INTERNALERROR ... SystemError: AST constructor
recursion depth mismatch`` (CPython < 3.11.8, gh-106905)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests import ast_guard
from tests.conftest import ROOT

# A test that fails before awaiting a task it started (as the console's browser tests did
# with their HTTP turns): the task's exception, never retrieved, is logged by the collector
# in the middle of pytest's parse of the failure's source (a busy collector: every time).
RUNS = 20
LEFT_BEHIND = f"""
import asyncio, gc
import pytest

def fail():
    return {{"a": 1}}["b"] + 1

async def turn():
    await asyncio.sleep(0)
    return {{"result": fail()}}

@pytest.mark.parametrize("i", range({RUNS}))
async def test_fails_before_awaiting_its_turn(i):
    gc.set_threshold(5)
    task = asyncio.ensure_future(turn())
    await asyncio.wait([task])  # it failed; its exception is not retrieved
    holder = {{"task": task}}
    holder["self"] = holder
    del task
    assert {{"got": [1, 2, 3]}} == {{"got": [1, 2, 4]}}
"""


def run_pytest(tmp_path: Path, *extra: str) -> str:
    (tmp_path / "test_left_behind.py").write_text(LEFT_BEHIND)
    # pytest prints full assertion lines in its summary too when it sees CI or
    # BUILD_NUMBER: the inner run's report must not depend on where this one runs
    outer = {k: v for k, v in os.environ.items() if k not in ("CI", "BUILD_NUMBER")}
    env = {**outer, "PYTHONPATH": str(ROOT)}
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    args += ["-o", "asyncio_mode=auto", *extra, "test_left_behind.py"]
    done = subprocess.run(
        args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    return done.stdout + done.stderr


def test_the_failures_are_reported(tmp_path: Path) -> None:
    out = run_pytest(tmp_path, "-p", "tests.ast_guard")
    assert "INTERNALERROR" not in out, out[-3000:]
    assert f"{RUNS} failed" in out
    assert out.count("AssertionError: assert {'got': [1, 2, 3]} == {'got': [1, 2, 4]}") == RUNS


def test_without_it_this_python_breaks_the_report(tmp_path: Path) -> None:
    """The scenario above does hit the bug here (or this Python has the fix)."""
    out = run_pytest(tmp_path)
    if ast_guard.AFFECTED:
        assert "SystemError: AST constructor recursion depth mismatch" in out, out[-3000:]
    else:
        assert f"{RUNS} failed" in out
