"""`.ci/run` is the CI entry point: a broken script fails CI before any test runs."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / ".ci" / "run"


def test_ci_script_parses() -> None:
    bash = shutil.which("bash")
    assert bash is not None, ".ci/run is a bash script"
    done = subprocess.run([bash, "-n", str(SCRIPT)], capture_output=True, text=True, timeout=10)
    assert done.returncode == 0, done.stderr


def test_ci_script_defines_its_helpers_before_use_and_ends_with_make_test() -> None:
    lines = [line for line in SCRIPT.read_text().splitlines() if line and not line.startswith("#")]
    defined = {
        i: m.group(1)
        for i, line in enumerate(lines)
        if (m := re.match(r"^([a-z_]+)\(\)\s*\{", line))
    }
    for name in set(defined.values()):
        first_def = min(i for i, n in defined.items() if n == name)
        uses = [i for i, line in enumerate(lines) if re.match(rf"^\s*{name}\s", line)]
        assert all(i > first_def for i in uses), f"{name} is used before it is defined"
    assert lines[0] == "set -euo pipefail" or "set -euo pipefail" in lines[:3]
    assert lines[-1].strip() == "make test"
