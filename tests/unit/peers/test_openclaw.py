"""The OpenClaw test peer's compile-cache link (internal/peers/openclaw.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from internal.peers import openclaw


def test_every_gateway_tmpdir_links_the_one_shared_cache(tmp_path: Path) -> None:
    cache = tmp_path / "peer" / ".compile-cache"
    first, second = tmp_path / "gw1" / "t", tmp_path / "gw2" / "t"
    assert openclaw.share_compile_cache(first, cache)
    assert openclaw.share_compile_cache(second, cache)
    (first / "node-compile-cache" / "entry").write_text("compiled")
    # what the first gateway's node wrote is what the second one reads
    assert (second / "node-compile-cache" / "entry").read_text() == "compiled"
    assert (first / "node-compile-cache").resolve() == cache.resolve()
    # a restart on the same tmpdir keeps the link
    assert openclaw.share_compile_cache(first, cache)


def test_a_cache_that_cannot_be_made_leaves_a_cold_start(tmp_path: Path) -> None:
    blocker = tmp_path / "peer"
    blocker.write_text("a file where the peer directory would be")  # mkdir fails, even as root
    assert not openclaw.share_compile_cache(tmp_path / "t", blocker / ".compile-cache")
    assert not (tmp_path / "t" / "node-compile-cache").exists()


class _Started(Exception):
    pass


def test_a_gateway_start_links_its_tmpdir_before_node_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "shared"
    monkeypatch.setattr(openclaw, "COMPILE_CACHE", cache)
    seen: dict[str, Any] = {}

    def popen(argv: list[str], **kw: Any) -> None:
        tmpdir = Path(kw["env"]["TMPDIR"])
        seen["link"] = (tmpdir / "node-compile-cache").resolve()
        raise _Started

    monkeypatch.setattr(openclaw.subprocess, "Popen", popen)
    gw = openclaw.OpenClawGateway(tmp_path / "gw", 1, "tok", "http://127.0.0.1:9/v1")
    with pytest.raises(_Started):
        gw.start()
    assert seen["link"] == cache.resolve()
