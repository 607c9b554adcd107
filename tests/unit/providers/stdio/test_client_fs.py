"""``fs/*`` served to agents: a path checked, then swapped for a symlink out of the
session directory before it is used (the agent runs beside the bridge), is refused."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from xwm_bridge.providers.stdio import client_fs
from xwm_bridge.providers.stdio.agent import ClientError

pytestmark = pytest.mark.asyncio


def swap_after_check(monkeypatch: pytest.MonkeyPatch, directory: Path, target: Path) -> None:
    """``resolve`` (the check) passes, then ``directory`` becomes a symlink to ``target``:
    what an agent racing the bridge does between the check and the open."""
    check = client_fs.resolve

    def racing(path: Any, root: str | None) -> str:
        checked = check(path, root)
        directory.rename(directory.with_name(directory.name + ".old"))
        directory.symlink_to(target)
        return checked

    monkeypatch.setattr(client_fs, "resolve", racing)


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path]:
    work = tmp_path / "work"
    (work / "sub").mkdir(parents=True)
    (work / "sub" / "notes.txt").write_text("inside")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "notes.txt").write_text("outside secret")
    return work, outside


async def test_a_read_does_not_follow_a_symlink_swapped_in_after_the_check(
    monkeypatch: pytest.MonkeyPatch, layout: tuple[Path, Path]
) -> None:
    work, outside = layout
    swap_after_check(monkeypatch, work / "sub", outside)
    params = {"path": str(work / "sub" / "notes.txt")}
    with pytest.raises(ClientError) as info:
        await client_fs.read_text_file(params, str(work), 1000)
    assert info.value.code in (-32602, -32002)


async def test_a_write_does_not_follow_a_symlink_swapped_in_after_the_check(
    monkeypatch: pytest.MonkeyPatch, layout: tuple[Path, Path]
) -> None:
    work, outside = layout
    swap_after_check(monkeypatch, work / "sub", outside)
    for name in ("notes.txt", "new/deeper.txt"):
        params = {"path": str(work / "sub" / name), "content": "escaped"}
        with pytest.raises(ClientError) as info:
            await client_fs.write_text_file(params, str(work), 1000)
        assert info.value.code == -32602
        (work / "sub").unlink()  # the next round swaps again
        (work / "sub.old").rename(work / "sub")
    assert (outside / "notes.txt").read_text() == "outside secret"
    assert sorted(os.listdir(outside)) == ["notes.txt"]  # no file, no directory, no temp


async def test_a_final_symlink_swapped_in_is_not_read_through(
    monkeypatch: pytest.MonkeyPatch, layout: tuple[Path, Path]
) -> None:
    work, outside = layout
    check = client_fs.resolve

    def racing(path: Any, root: str | None) -> str:
        checked = check(path, root)
        (work / "sub" / "notes.txt").unlink()
        (work / "sub" / "notes.txt").symlink_to(outside / "notes.txt")
        return checked

    monkeypatch.setattr(client_fs, "resolve", racing)
    with pytest.raises(ClientError):
        await client_fs.read_text_file({"path": str(work / "sub" / "notes.txt")}, str(work), 99)
    (work / "sub" / "notes.txt").unlink()
    (work / "sub" / "notes.txt").write_text("inside")
    # a write replaces the symlink swapped in itself, never the file it points to
    target = work / "sub" / "notes.txt"
    await client_fs.write_text_file({"path": str(target), "content": "new"}, str(work), 99)
    assert not target.is_symlink() and target.read_text() == "new"
    assert (outside / "notes.txt").read_text() == "outside secret"


async def test_a_missing_directory_made_a_symlink_after_the_check_is_not_created_through(
    monkeypatch: pytest.MonkeyPatch, layout: tuple[Path, Path]
) -> None:
    # the write makes the missing directories of its path: one the agent makes a
    # symlink out of the root between the check and the mkdir is not written through
    work, outside = layout
    check = client_fs.resolve

    def racing(path: Any, root: str | None) -> str:
        checked = check(path, root)
        (work / "sub" / "new").symlink_to(outside)
        return checked

    monkeypatch.setattr(client_fs, "resolve", racing)
    params = {"path": str(work / "sub" / "new" / "deeper" / "x.txt"), "content": "escaped"}
    with pytest.raises(ClientError) as info:
        await client_fs.write_text_file(params, str(work), 1000)
    assert info.value.code == -32602
    assert sorted(os.listdir(outside)) == ["notes.txt"]  # no directory, no file, no temp
