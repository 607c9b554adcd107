"""Artifact enrichment (forwarding.md §4.8), confined to configured allowed roots.

The original inlined up to 24 files from any client- or upstream-named
directory on the bridge host (even its own home). Here a candidate root is
scanned only if it resolves inside one of ``allowed_roots``; only regular
files are read (symbolic links and special files are skipped, so a named pipe
cannot hang the turn), each opened one path component at a time without
following a symlink (``beneath.py``: a directory swapped for a link out of the
root after the walk is not followed); per-file, total-size and entry-count caps
bound the work.
"""

from __future__ import annotations

import base64
import itertools
import mimetypes
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xwm_bridge import beneath
from xwm_bridge.config import BridgeConfig

SKIPPED_DIRS = frozenset({".git", ".dart_tool", "build", "node_modules"})
TEXT_EXTENSIONS = frozenset(
    {".md", ".markdown", ".txt", ".log", ".json", ".yaml", ".yml", ".csv", ".html", ".htm"}
)
MAX_ENTRIES_SCANNED = 20_000


@dataclass(frozen=True, slots=True)
class ArtifactLimits:
    """Where files may be read from, and how many and how much: artifact enrichment
    here, a stdio agent's attachments and artifacts (``stdio/prompt.py``)."""

    allowed_roots: tuple[str, ...]
    max_files: int = 24
    max_file_bytes: int = 2 * 1024 * 1024
    max_total_bytes: int = 16 * 1024 * 1024

    @classmethod
    def of_config(cls, config: BridgeConfig) -> ArtifactLimits:
        """``allowed_roots`` and the ``limits.artifact_max_*`` keys."""
        limits = config.limits
        return cls(
            allowed_roots=config.allowed_roots,
            max_files=limits.artifact_max_files,
            max_file_bytes=limits.artifact_max_file_bytes,
            max_total_bytes=limits.artifact_max_total_bytes,
        )


def confine(path: str, allowed_roots: tuple[str, ...]) -> Path | None:
    """The real path of ``path`` if it is a directory inside an allowed root, else None."""
    if not path or "\0" in path or not os.path.isabs(path):  # a NUL: no OS call takes it
        return None
    try:
        real = Path(path).resolve(strict=True)
    except (OSError, RuntimeError):
        return None
    if not real.is_dir():
        return None
    for root in allowed_roots:
        try:
            root_real = Path(root).resolve(strict=True)
        except (OSError, RuntimeError):
            continue
        if real == root_real or root_real in real.parents:
            return real
    return None


def _walk(root: Path) -> list[tuple[float, str, int, Path]]:
    found: list[tuple[float, str, int, Path]] = []
    stack = [root]
    seen = 0
    while stack:
        current = stack.pop()
        try:
            with os.scandir(current) as it:
                # no more than the cap leaves to scan: a directory of millions of
                # entries was listed (and sorted) whole before the cap was looked at
                listed = itertools.islice(it, MAX_ENTRIES_SCANNED - seen + 1)
                entries = sorted(listed, key=lambda e: e.name, reverse=True)
        except OSError:
            continue
        for entry in entries:
            seen += 1
            if seen > MAX_ENTRIES_SCANNED:
                return found
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                if entry.name not in SKIPPED_DIRS:
                    stack.append(Path(entry.path))
            elif stat.S_ISREG(st.st_mode):
                rel = Path(entry.path).relative_to(root).as_posix()
                found.append((st.st_mtime, rel, st.st_size, Path(entry.path)))
    return found


def _content_type(name: str) -> str:
    guessed, _ = mimetypes.guess_type(name)
    if guessed is None:
        return "application/octet-stream"
    if guessed.startswith("text/"):
        return f"{guessed}; charset=utf-8"
    return guessed


def scan(root: Path, limits: ArtifactLimits) -> list[dict[str, Any]]:
    """Newest files first, at most ``max_files``, each ≤ ``max_file_bytes``."""
    candidates = [c for c in _walk(root) if c[2] <= limits.max_file_bytes]
    # the original's walk order (lexical per directory, depth first: "a/x" before
    # "a-b"), then stable by mtime; comparing path components gives exactly that
    candidates.sort(key=lambda c: c[1].split("/"))
    candidates.sort(key=lambda c: c[0], reverse=True)
    out: list[dict[str, Any]] = []
    total = 0
    for _, rel, size, path in candidates[: limits.max_files]:
        if total + size > limits.max_total_bytes:
            break
        try:
            fd = beneath.open_file(path)  # no component a symlink: see beneath.py
            with os.fdopen(fd, "rb") as fh:
                if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                    continue
                data = fh.read(limits.max_file_bytes + 1)
        except OSError:
            continue
        if len(data) > limits.max_file_bytes:
            continue
        if total + len(data) > limits.max_total_bytes:  # it grew since the walk saw it
            break
        total += len(data)
        name = path.name
        ctype = _content_type(name)
        ext = path.suffix.lower()
        if ctype.startswith("text/") or ext in TEXT_EXTENSIONS:
            encoding, content = "utf8", data.decode("utf-8", "replace")
        else:
            encoding, content = "base64", base64.b64encode(data).decode("ascii")
        out.append(
            {
                "relativePath": rel,
                "label": name,
                "contentType": ctype,
                "encoding": encoding,
                "content": content,
                "sizeBytes": size,
            }
        )
    return out


def collect(candidate_dirs: list[str], limits: ArtifactLimits) -> list[dict[str, Any]]:
    """First allowed candidate directory that yields at least one file wins."""
    if not limits.allowed_roots:
        return []
    seen: set[str] = set()
    for candidate in candidate_dirs:
        if not candidate or candidate in seen:
            continue
        seen.add(candidate)
        root = confine(candidate, limits.allowed_roots)
        if root is None:
            continue
        files = scan(root, limits)
        if files:
            return files
    return []
