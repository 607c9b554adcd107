"""xwm_bridge.providers.artifacts: artifact scan confined to allowed roots (forwarding.md §4.8)."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest

from xwm_bridge.providers import artifacts
from xwm_bridge.providers.artifacts import ArtifactLimits, collect, confine, scan


def write(path: Path, data: bytes | str, mtime: float | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    path.write_bytes(data)
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def limits(*roots: Path | str, **kw: int) -> ArtifactLimits:
    return ArtifactLimits(allowed_roots=tuple(str(r) for r in roots), **kw)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "allowed"
    r.mkdir()
    return r


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    o = tmp_path / "outside"
    o.mkdir()
    write(o / "secret.txt", "top secret")
    return o


def paths(items: list[dict[str, object]]) -> list[object]:
    return [a["relativePath"] for a in items]


# --- the examples.md §3 artifact ------------------------------------------------------


def test_examples_report_txt(root: Path) -> None:
    work = root / "demo"
    write(work / "outputs" / "report.txt", "artifact-body")
    assert collect([str(work)], limits(root)) == [
        {
            "relativePath": "outputs/report.txt",
            "label": "report.txt",
            "contentType": "text/plain; charset=utf-8",
            "encoding": "utf8",
            "content": "artifact-body",
            "sizeBytes": 13,
        }
    ]


def test_root_itself_may_be_scanned(root: Path) -> None:
    write(root / "a.md", "# hi")
    out = collect([str(root)], limits(root))
    assert paths(out) == ["a.md"]
    assert out[0]["encoding"] == "utf8"


# --- confinement ----------------------------------------------------------------------


def test_no_allowed_roots_means_nothing(root: Path) -> None:
    write(root / "a.txt", "x")
    assert collect([str(root)], ArtifactLimits(allowed_roots=())) == []


def test_directory_outside_roots_is_never_read(root: Path, outside: Path) -> None:
    assert collect([str(outside)], limits(root)) == []
    assert confine(str(outside), (str(root),)) is None


def test_a_directory_named_with_a_nul_is_no_candidate(root: Path) -> None:
    """An upstream's ``resolvedWorkingDirectory`` may hold anything: a NUL is skipped."""
    write(root / "a.txt", "x")
    assert confine(f"{root}\0x", (str(root),)) is None
    assert [f["relativePath"] for f in collect([f"{root}\0x", str(root)], limits(root))] == [
        "a.txt"
    ]


def test_symlinked_directory_pointing_outside_is_rejected(root: Path, outside: Path) -> None:
    link = root / "escape"
    link.symlink_to(outside, target_is_directory=True)
    assert confine(str(link), (str(root),)) is None
    assert collect([str(link)], limits(root)) == []


def test_symlinked_directory_inside_root_is_not_followed_by_scan(root: Path, outside: Path) -> None:
    work = root / "work"
    write(work / "own.txt", "mine")
    (work / "link").symlink_to(outside, target_is_directory=True)
    out = collect([str(work)], limits(root))
    assert paths(out) == ["own.txt"]


def test_a_directory_swapped_for_a_symlink_after_the_walk_is_not_read(
    root: Path, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer inside the root (the agent) replaces a directory the walk listed with
    a symlink out of the root before its files are opened: nothing outside is read."""
    work = root / "work"
    write(work / "sub" / "secret.txt", "inside")
    walk = artifacts._walk

    def walk_then_swap(top: Path) -> list[tuple[float, str, int, Path]]:
        found = walk(top)
        (work / "sub").rename(work / "sub.old")
        (work / "sub").symlink_to(outside, target_is_directory=True)
        return found

    monkeypatch.setattr(artifacts, "_walk", walk_then_swap)
    out = collect([str(work)], limits(root))
    assert [a["content"] for a in out if a["content"] == "top secret"] == []
    assert out == []


def test_a_root_swapped_for_a_symlink_after_it_was_confined_is_not_read(
    root: Path, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = root / "work"
    write(work / "secret.txt", "inside")
    walk = artifacts._walk

    def walk_then_swap(top: Path) -> list[tuple[float, str, int, Path]]:
        found = walk(top)
        work.rename(root / "work.old")
        work.symlink_to(outside, target_is_directory=True)
        return found

    monkeypatch.setattr(artifacts, "_walk", walk_then_swap)
    assert collect([str(work)], limits(root)) == []


def test_dotdot_escape_is_rejected(root: Path, outside: Path) -> None:
    sneaky = f"{root}/../outside"
    assert os.path.isdir(sneaky)
    assert confine(sneaky, (str(root),)) is None
    assert collect([sneaky], limits(root)) == []


def test_dotdot_that_stays_inside_is_fine(root: Path) -> None:
    write(root / "a" / "f.txt", "x")
    (root / "b").mkdir()
    assert paths(collect([f"{root}/b/../a"], limits(root))) == ["f.txt"]


def test_sibling_with_common_prefix_is_outside(tmp_path: Path) -> None:
    allowed = tmp_path / "data"
    sibling = tmp_path / "data-evil"
    allowed.mkdir()
    write(sibling / "x.txt", "no")
    assert confine(str(sibling), (str(allowed),)) is None


def test_symlinked_allowed_root_is_resolved(tmp_path: Path) -> None:
    real = tmp_path / "real"
    write(real / "w" / "f.txt", "ok")
    alias = tmp_path / "alias"
    alias.symlink_to(real, target_is_directory=True)
    assert paths(collect([str(real / "w")], limits(alias))) == ["f.txt"]
    assert paths(collect([str(alias / "w")], limits(real))) == ["f.txt"]


@pytest.mark.parametrize("candidate", ["", "relative/dir", "."])
def test_relative_or_blank_candidates_rejected(root: Path, candidate: str) -> None:
    assert confine(candidate, (str(root),)) is None


def test_missing_or_file_candidate_rejected(root: Path) -> None:
    f = write(root / "file.txt", "x")
    assert confine(str(f), (str(root),)) is None
    assert confine(str(root / "missing"), (str(root),)) is None


def test_missing_allowed_root_is_skipped(tmp_path: Path, root: Path) -> None:
    write(root / "f.txt", "x")
    lim = limits(tmp_path / "does-not-exist", root)
    assert paths(collect([str(root)], lim)) == ["f.txt"]


# --- candidate order ------------------------------------------------------------------


def test_first_candidate_with_files_wins(root: Path, outside: Path) -> None:
    empty = root / "empty"
    empty.mkdir()
    full = root / "full"
    write(full / "f.txt", "x")
    other = root / "other"
    write(other / "g.txt", "y")
    candidates = ["", str(outside), str(empty), str(root / "missing"), str(full), str(other)]
    assert paths(collect(candidates, limits(root))) == ["f.txt"]


def test_no_candidate_yields_files(root: Path) -> None:
    (root / "empty").mkdir()
    assert collect([str(root / "empty"), ""], limits(root)) == []
    assert collect([], limits(root)) == []


# --- content --------------------------------------------------------------------------


def test_binary_file_is_base64(root: Path) -> None:
    data = bytes(range(256))
    write(root / "blob.bin", data)
    (item,) = collect([str(root)], limits(root))
    assert item["encoding"] == "base64"
    assert item["contentType"] == "application/octet-stream"
    assert base64.b64decode(str(item["content"])) == data
    assert item["sizeBytes"] == 256


def test_known_binary_type(root: Path) -> None:
    write(root / "pic.png", b"\x89PNG\r\n\x1a\n")
    (item,) = collect([str(root)], limits(root))
    assert item["contentType"] == "image/png"
    assert item["encoding"] == "base64"
    assert item["content"] == base64.b64encode(b"\x89PNG\r\n\x1a\n").decode()


@pytest.mark.parametrize(
    "name", ["data.json", "notes.MD", "conf.yaml", "c.yml", "rows.csv", "x.log"]
)
def test_text_extensions_are_utf8(root: Path, name: str) -> None:
    write(root / name, "héllo")
    (item,) = collect([str(root)], limits(root))
    assert item["encoding"] == "utf8"
    assert item["content"] == "héllo"
    assert item["sizeBytes"] == len("héllo".encode())


def test_no_extension_is_octet_stream(root: Path) -> None:
    write(root / "Makefile", "all:\n")
    (item,) = collect([str(root)], limits(root))
    assert item["contentType"] == "application/octet-stream"
    assert item["encoding"] == "base64"
    assert item["label"] == "Makefile"


def test_empty_file_is_an_artifact(root: Path) -> None:
    write(root / "empty.txt", b"")
    (item,) = collect([str(root)], limits(root))
    assert item["content"] == "" and item["sizeBytes"] == 0


def test_nested_relative_path_uses_slashes(root: Path) -> None:
    write(root / "a" / "b" / "c" / "deep.txt", "d")
    (item,) = collect([str(root)], limits(root))
    assert item["relativePath"] == "a/b/c/deep.txt"
    assert item["label"] == "deep.txt"


# --- skipping -------------------------------------------------------------------------


@pytest.mark.parametrize("skipped", [".git", "node_modules", "build", ".dart_tool"])
def test_skipped_directories(root: Path, skipped: str) -> None:
    write(root / skipped / "inner.txt", "no")
    write(root / "sub" / skipped / "deeper.txt", "no")
    write(root / "keep.txt", "yes")
    assert paths(collect([str(root)], limits(root))) == ["keep.txt"]


def test_other_hidden_directories_are_entered(root: Path) -> None:
    write(root / ".hidden" / "h.txt", "h")
    write(root / ".github" / "w.yml", "w")
    assert sorted(map(str, paths(collect([str(root)], limits(root))))) == [
        ".github/w.yml",
        ".hidden/h.txt",
    ]


def test_root_named_like_a_skipped_dir_is_scanned(root: Path) -> None:
    write(root / "build" / "out.txt", "o")
    assert paths(collect([str(root / "build")], limits(root))) == ["out.txt"]


def test_symlinked_files_are_skipped(root: Path, outside: Path) -> None:
    write(root / "real.txt", "r")
    (root / "link.txt").symlink_to(outside / "secret.txt")
    (root / "inner-link.txt").symlink_to(root / "real.txt")
    (root / "dangling.txt").symlink_to(root / "nowhere.txt")
    out = collect([str(root)], limits(root))
    assert paths(out) == ["real.txt"]
    assert all("secret" not in str(a["content"]) for a in out)


@pytest.mark.timeout(10)
def test_fifo_is_skipped_without_hanging(root: Path) -> None:
    os.mkfifo(root / "pipe.txt")
    write(root / "plain.txt", "p")
    assert paths(collect([str(root)], limits(root))) == ["plain.txt"]


@pytest.mark.timeout(10)
def test_directory_with_only_a_fifo_yields_nothing(root: Path) -> None:
    os.mkfifo(root / "pipe")
    assert collect([str(root)], limits(root)) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root can read anything")
def test_unreadable_file_and_directory_are_skipped(root: Path) -> None:
    secret = write(root / "locked.txt", "x")
    secret.chmod(0)
    locked_dir = root / "locked-dir"
    write(locked_dir / "inside.txt", "y")
    locked_dir.chmod(0)
    write(root / "open.txt", "z")
    try:
        assert paths(collect([str(root)], limits(root))) == ["open.txt"]
    finally:
        locked_dir.chmod(0o755)
        secret.chmod(0o644)


# --- caps -----------------------------------------------------------------------------


def test_per_file_size_cap(root: Path) -> None:
    write(root / "big.txt", "x" * 101, mtime=2000)
    write(root / "ok.txt", "y" * 100, mtime=1000)
    out = collect([str(root)], limits(root, max_file_bytes=100))
    assert paths(out) == ["ok.txt"]
    assert out[0]["sizeBytes"] == 100


def test_default_per_file_cap_is_2_mib(root: Path) -> None:
    write(root / "exact.bin", b"\0" * (2 * 1024 * 1024), mtime=1000)
    write(root / "over.bin", b"\0" * (2 * 1024 * 1024 + 1), mtime=2000)
    assert paths(collect([str(root)], limits(root))) == ["exact.bin"]


def test_max_files_cap_keeps_newest(root: Path) -> None:
    for i in range(10):
        write(root / f"f{i}.txt", str(i), mtime=1_000_000 + i)
    out = collect([str(root)], limits(root, max_files=3))
    assert paths(out) == ["f9.txt", "f8.txt", "f7.txt"]


def test_default_max_files_is_24(root: Path) -> None:
    for i in range(30):
        write(root / f"f{i:02d}.txt", "x", mtime=1_000_000 + i)
    out = collect([str(root)], limits(root))
    assert len(out) == 24
    assert out[0]["relativePath"] == "f29.txt"
    assert out[-1]["relativePath"] == "f06.txt"


def test_oversized_files_do_not_use_up_the_file_cap(root: Path) -> None:
    write(root / "huge.txt", "x" * 50, mtime=3000)
    write(root / "a.txt", "a", mtime=2000)
    write(root / "b.txt", "b", mtime=1000)
    out = collect([str(root)], limits(root, max_files=2, max_file_bytes=10))
    assert paths(out) == ["a.txt", "b.txt"]


def test_total_bytes_cap(root: Path) -> None:
    write(root / "new.txt", "n" * 40, mtime=3000)
    write(root / "mid.txt", "m" * 40, mtime=2000)
    write(root / "old.txt", "o" * 40, mtime=1000)
    out = collect([str(root)], limits(root, max_total_bytes=100))
    assert paths(out) == ["new.txt", "mid.txt"]
    assert sum(int(str(a["sizeBytes"])) for a in out) <= 100


def test_total_bytes_cap_exact_fit(root: Path) -> None:
    write(root / "a.txt", "a" * 50, mtime=2000)
    write(root / "b.txt", "b" * 50, mtime=1000)
    assert paths(collect([str(root)], limits(root, max_total_bytes=100))) == ["a.txt", "b.txt"]


# --- ordering -------------------------------------------------------------------------


def test_newest_first(root: Path) -> None:
    write(root / "a.txt", "a", mtime=1000)
    write(root / "z" / "b.txt", "b", mtime=3000)
    write(root / "c.txt", "c", mtime=2000)
    assert paths(collect([str(root)], limits(root))) == ["z/b.txt", "c.txt", "a.txt"]


def test_equal_mtimes_keep_walk_order(root: Path) -> None:
    # the original walked in lexical order (depth first) and sorted stably by mtime
    for rel in ("b.txt", "a.txt", "a/x.txt", "a-b.txt", "c/d/e.txt"):
        write(root / rel, rel, mtime=5000)
    assert paths(collect([str(root)], limits(root))) == [
        "a/x.txt",
        "a-b.txt",
        "a.txt",
        "b.txt",
        "c/d/e.txt",
    ]


def test_scan_directly(root: Path) -> None:
    write(root / "one.txt", "1")
    out = scan(root, limits(root))
    assert paths(out) == ["one.txt"]


def test_a_huge_directory_is_listed_no_further_than_the_entry_cap(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A directory was listed and sorted whole before the entry cap was looked at: one
    of millions of entries (a build output) cost their memory and time on each turn."""
    for i in range(40):
        write(root / f"f{i:02}.txt", "x")
    monkeypatch.setattr(artifacts, "MAX_ENTRIES_SCANNED", 10)
    pulled = 0
    real_scandir = os.scandir

    class Counting:
        def __init__(self, path: Path) -> None:
            self._it = real_scandir(path)

        def __enter__(self) -> Counting:
            return self

        def __exit__(self, *exc: object) -> None:
            self._it.close()

        def __iter__(self) -> Counting:
            return self

        def __next__(self) -> os.DirEntry[str]:
            nonlocal pulled
            entry = next(self._it)
            pulled += 1
            return entry

    monkeypatch.setattr(artifacts.os, "scandir", Counting)
    found = scan(root, limits(root, max_files=100))
    assert pulled <= 11
    assert len(found) == 10


def test_files_grown_since_the_walk_stay_within_the_total_cap(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The total cap was checked against the sizes the walk saw: files that grew before
    they were read (logs being written) were read whole, past ``max_total_bytes``."""
    for name in ("a.txt", "b.txt", "c.txt"):
        write(root / name, "x" * 50, mtime=1_000)
    walk = artifacts._walk

    def stale(top: Path) -> list[tuple[float, str, int, Path]]:
        return [(mtime, rel, 1, path) for mtime, rel, _, path in walk(top)]

    monkeypatch.setattr(artifacts, "_walk", stale)
    found = scan(root, limits(root, max_file_bytes=60, max_total_bytes=80))
    assert paths(found) == ["a.txt"]  # a and b: 100 bytes
