"""Markers shared by test modules."""

from __future__ import annotations

import os
import shutil

import pytest

#: a test that runs an agent under bubblewrap: skipped where it is not installed,
#: except in CI (``CI=true``, set by .ci/run, which installs it), where it fails
needs_bwrap = pytest.mark.skipif(
    shutil.which("bwrap") is None and os.environ.get("CI") != "true",
    reason="bubblewrap not installed (apt install bubblewrap; .ci/run installs it)",
)

#: an asyncio test run on both event loops the daemon may use: uvloop (``[fast]``)
#: and asyncio's default one (tests/conftest.py ``pytest_asyncio_loop_factories``)
both_loops = pytest.mark.asyncio(loop_factories=["uvloop", "asyncio"])
