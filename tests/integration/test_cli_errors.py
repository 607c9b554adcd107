"""What an operator sees when a command line, a config file or the environment is
wrong: one clear line on stderr and a documented exit code, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.test_cli import assert_one_line_error, run, write_config


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("limts: {}\n", "limts: unknown key (did you mean limits?)"),
        ("limits: {max_queue_dept: 3}\n", "limits.max_queue_dept: unknown key (did you mean"),
        ("providers: [{id: x, endpont: http://x}]\n", "(did you mean endpoint?)"),
    ],
)
def test_an_unknown_key_suggests_the_nearest_one(tmp_path: Path, text: str, expected: str) -> None:
    proc = run("serve", "--config", str(write_config(tmp_path, text)))
    assert_one_line_error(proc, expected)


def test_an_unknown_key_far_from_any_suggests_nothing(tmp_path: Path) -> None:
    proc = run("serve", "--config", str(write_config(tmp_path, "zzzzqqq: 1\n")))
    line = assert_one_line_error(proc, "zzzzqqq: unknown key")
    assert "did you mean" not in line
