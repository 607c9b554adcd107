"""Routing memory (routing.md §6): locations, sanitization, parsing, reading. Recording
(the block, the append, the rotation) is ``memory_write.py``.

Same files and format as the original, with its weaknesses fixed:

* files are read and appended only inside configured roots — the memory home
  (``<memory_home>/self-improving``) and, for ``<wd>/.xworkmate/memory.md``, a
  working directory inside ``router.memory_project_roots`` (resolved, so ``..``
  and symlinks cannot escape). Below the resolved working directory every
  component (``.xworkmate``, ``memory.md``) is opened relative to its parent's
  directory fd with ``O_NOFOLLOW``: a cloned repository that ships
  ``.xworkmate`` as a symlink cannot make the bridge read outside the roots. An
  empty or relative working directory reads no project file, and a project name
  is only ever a plain file name;
* preference prefixes are recognized *and removed* case-insensitively (§9.7);
* appends are single ``O_APPEND`` writes under an exclusive lock, never follow a
  symlink nor open anything but a regular file (a FIFO would block), and
  rotate the file to ``<file>.1`` above ``memory_max_bytes``;
* a failed write is reported to the caller (who logs it), never raised (§9.8).

All functions block on the filesystem; the async callers run them in a thread.
"""

from __future__ import annotations

import asyncio
import functools
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from xwm_bridge.beneath import FILE_FLAGS, parent_fd

GLOBAL, PROJECT_HOME, PROJECT_LOCAL = "global", "project-home", "project-local"
_SECRET_WORDS = ("token", "password", "secret", "api_key", "apikey", "api key")
_PREFIXES = ("preferred-route:", "preferred-model:", "preferred-skills:", "provider:")
READ_CAP_FACTOR = 2  # a file may exceed the cap by one block before rotation


@dataclass(frozen=True, slots=True)
class MemorySource:
    path: str
    scope: str

    def wire(self) -> dict[str, str]:
        return {"path": self.path, "scope": self.scope}


@dataclass(frozen=True, slots=True)
class Preferences:
    route: str = ""
    model: str = ""
    skills: tuple[str, ...] = ()
    provider: str = ""
    sources: tuple[MemorySource, ...] = ()


NO_PREFERENCES = Preferences()


@dataclass(frozen=True, slots=True)
class MemoryLocations:
    """Where memory may live for one request; ``None`` = not allowed."""

    memory_dir: Path | None
    project: str
    project_local_dir: Path | None
    #: :meth:`reads` as (scope, path string), computed once
    paths: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(
        cls, memory_dir: Path | None, project: str, project_local_dir: Path | None
    ) -> MemoryLocations:
        bare = cls(memory_dir, project, project_local_dir)
        return cls(
            memory_dir, project, project_local_dir, tuple((s, str(p)) for s, p in bare.reads())
        )

    def reads(self) -> list[tuple[str, Path]]:
        out: list[tuple[str, Path]] = []
        if self.memory_dir is not None:
            out.append((GLOBAL, self.memory_dir / "memory.md"))
            if self.project:
                out.append((PROJECT_HOME, self.memory_dir / "projects" / f"{self.project}.md"))
        if self.project_local_dir is not None:
            out.append((PROJECT_LOCAL, self.project_local_dir / "memory.md"))
        return out

    def anchor(self, path: Path) -> tuple[Path, tuple[str, ...]]:
        """(trusted directory, components below it opened without following symlinks).

        Project-local files hang below the resolved working directory, whose contents
        a repository controls: nothing below it is followed. Home files: only the
        file itself (the home is the user's own, and may be a symlink farm)."""
        local = self.project_local_dir
        if local is not None and path.parent == local:
            return local.parent, (local.name, path.name)
        return path.parent, (path.name,)


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


#: a working directory longer than this (Linux's PATH_MAX) names no memory: no such
#: path can be opened (ENAMETOOLONG), and the caches keyed by it would hold it
MAX_PATH = 4096
#: a file name's bytes at most (NAME_MAX); ``<project>.md`` must fit
_MAX_NAME = 255


def project_name(working_directory: str) -> str:
    """The last path element, if it is a plain, safe file name."""
    name = os.path.basename(working_directory.strip().rstrip("/\\"))
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        return ""
    if len(name.encode("utf-8", "surrogatepass")) + len(".md") > _MAX_NAME:
        return ""  # no such file can exist (ENAMETOOLONG)
    return name


@functools.lru_cache(maxsize=64)
def _real_dir(path: str) -> Path:
    # configured directories are resolved once; client paths are resolved every time
    return Path(os.path.realpath(path))


def resolves(working_directory: str, project_roots: tuple[str, ...]) -> bool:
    """:func:`locate` resolves ``working_directory`` (a filesystem call per component
    of the client's path, which may block: its callers on the event loop run it in a
    thread then)."""
    wd = working_directory.strip()
    return bool(wd) and len(wd) <= MAX_PATH and os.path.isabs(wd) and bool(project_roots)


def locate(
    working_directory: str, memory_home: str, project_roots: tuple[str, ...]
) -> MemoryLocations:
    home = memory_home.strip() or os.environ.get("HOME", "").strip()
    memory_dir = _real_dir(home) / "self-improving" if os.path.isabs(home) else None
    wd = working_directory.strip()
    if len(wd) > MAX_PATH:
        wd = ""
    project = project_name(wd) if wd else ""
    local_dir: Path | None = None
    if resolves(wd, project_roots):
        resolved = Path(os.path.realpath(wd))
        for root in project_roots:
            if _inside(resolved, _real_dir(root)):
                local_dir = resolved / ".xworkmate"
                break
    return MemoryLocations.of(memory_dir, project, local_dir)


def sanitize(text: str) -> str:
    """§6.3: drop lines that mention credentials; keep blank lines; trim."""
    kept = [
        line
        for line in text.splitlines()
        if not any(word in line.strip().lower() for word in _SECRET_WORDS)
    ]
    return "\n".join(kept).strip()


@dataclass
class _Partial:
    route: str = ""
    model: str = ""
    provider: str = ""
    skills: list[str] = field(default_factory=list)


def parse(text: str) -> _Partial:
    """§6.2/§6.4 for one sanitized file; prefixes are removed case-insensitively, and
    the accumulated ``preferred-skills`` are deduped (case-insensitive, first spelling
    kept, as §4.1 dedupes every other skill list)."""
    out = _Partial()
    for raw in text.splitlines():
        line = raw.strip()
        lowered = line.lower()
        for prefix in _PREFIXES:
            if not lowered.startswith(prefix):
                continue
            value = line[len(prefix) :].strip()
            if prefix == "preferred-route:":
                out.route = "gateway" if value.lower() == "gateway-chat" else value
            elif prefix == "preferred-model:":
                out.model = value
            elif prefix == "provider:":
                out.provider = value
            else:
                # every recorded block repeats the skills of the turn, and a turn whose
                # skills came from memory records them again: kept with duplicates, the
                # list doubled with each such turn (128 copies of one skill after 8)
                seen = {s.lower() for s in out.skills}
                for skill in value.split(","):
                    skill = skill.strip()
                    if skill and skill.lower() not in seen:
                        seen.add(skill.lower())
                        out.skills.append(skill)
            break
    return out


def _stat_beneath(base: Path, parts: tuple[str, ...]) -> os.stat_result:
    with parent_fd(base, parts) as fd:
        return os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)


def _read_text(base: Path, parts: tuple[str, ...], cap: int) -> str:
    """The file's text, at most its last ``cap`` bytes: a later line wins (§6.4), so a
    file past the cap is read from its newest lines (from its start, the preference
    recorded last was not seen), without the line the cap cuts."""
    with parent_fd(base, parts) as parent:
        fd = os.open(parts[-1], FILE_FLAGS, dir_fd=parent)
    return regular_tail(fd, cap)


def regular_tail(fd: int, cap: int) -> str:
    """The last ``cap`` bytes of the regular file open on ``fd`` (closed here), without
    the line the cap cuts; ``""`` for a FIFO or a device (never read)."""
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            return ""
        if st.st_size <= cap:
            data = fh.read(cap)
        else:
            fh.seek(st.st_size - cap)
            data = fh.read(cap)
            data = data[data.find(b"\n") + 1 :] if b"\n" in data else b""
        return data.decode("utf-8", errors="replace")


def _read_sanitized(locations: MemoryLocations, path: Path, max_bytes: int) -> str:
    try:
        base, parts = locations.anchor(path)
        return sanitize(_read_text(base, parts, max_bytes * READ_CAP_FACTOR))
    except (OSError, ValueError):
        return ""


def _read_parsed(locations: MemoryLocations, path: Path, max_bytes: int) -> _Partial | None:
    text = _read_sanitized(locations, path, max_bytes)
    return parse(text) if text else None


def load(locations: MemoryLocations, max_bytes: int) -> Preferences:
    """Read every location now (blocking)."""
    return merge([(s, p, _read_sanitized(locations, p, max_bytes)) for s, p in locations.reads()])


def merge(entries: list[tuple[str, Path, str]]) -> Preferences:
    """§6.4 across files in scope order; blank (sanitized) files do not contribute."""
    return merge_parsed([(s, p, parse(text) if text else None) for s, p, text in entries])


def merge_parsed(entries: list[tuple[str, Path, _Partial | None]]) -> Preferences:
    """:func:`merge` of files parsed before; ``None``: a blank (sanitized) file."""
    route = model = provider = ""
    skills: tuple[str, ...] = ()
    sources: list[MemorySource] = []
    for scope, path, part in entries:
        if part is None:
            continue
        sources.append(MemorySource(str(path), scope))
        route = part.route or route
        model = part.model or model
        provider = part.provider or provider
        if part.skills:
            skills = tuple(part.skills)
    return Preferences(route, model, skills, provider, tuple(sources))


_Signature = tuple[int, int, int, int]
#: how long a file's stat result is trusted: a memory edit is seen within this long,
#: and a turn makes no filesystem call while it holds
STAT_TTL = 1.0


@dataclass(slots=True)
class _Checked:
    at: float
    #: (device, inode, mtime, size) of a regular file; None = missing or not a file
    sig: _Signature | None
    #: what the file says, parsed once when read (never its text: up to twice
    #: ``memory_max_bytes`` in each entry); None = blank once sanitized
    part: _Partial | None = None
    read: bool = False


class MemoryReader:
    """Loads memory on every resolution, re-reading only files that changed.

    Each file is ``lstat``-ed at most once per ``stat_ttl`` seconds (a missing
    file is the common case); a file whose (device, inode, mtime, size) differs
    from the cached one is read and parsed in a worker thread, and only what it
    says is kept (route, model, provider, skills). This keeps the "read on every
    resolution" semantics (with at most ``stat_ttl`` of staleness) without a
    filesystem call or a thread hop per turn.
    """

    def __init__(
        self,
        max_bytes: int,
        entries: int = 1024,
        *,
        stat_ttl: float = STAT_TTL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._max_bytes = max_bytes
        self._entries = entries
        self._ttl = stat_ttl
        self._clock = clock
        self._cache: dict[str, _Checked] = {}

    async def load(self, locations: MemoryLocations) -> Preferences:
        now = self._clock()
        found: list[tuple[str, str, _Checked]] = []
        stale: list[tuple[str, _Checked]] = []
        for scope, path in locations.paths:
            hit = self._cache.get(path)
            if hit is None or now - hit.at >= self._ttl:
                hit = self._check(locations, path, hit, now)
            if hit.sig is not None and not hit.read:
                stale.append((path, hit))
            if hit.sig is not None:
                found.append((scope, path, hit))
        if stale:
            parts = await asyncio.to_thread(
                lambda: [_read_parsed(locations, Path(p), self._max_bytes) for p, _ in stale]
            )
            for (_, hit), part in zip(stale, parts, strict=True):
                hit.part, hit.read = part, True
        if not found:
            return NO_PREFERENCES  # the common case: no memory file at all
        return merge_parsed([(s, Path(p), hit.part) for s, p, hit in found])

    def invalidate(self, path: str) -> None:
        """Forget what is known of ``path`` (the bridge just wrote it)."""
        self._cache.pop(path, None)

    def _check(
        self, locations: MemoryLocations, path: str, old: _Checked | None, now: float
    ) -> _Checked:
        try:
            st = _stat_beneath(*locations.anchor(Path(path)))  # never through a symlink
        except (OSError, ValueError):
            sig = None
        else:
            sig = (
                (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
                if stat.S_ISREG(st.st_mode)
                else None
            )
        if old is not None and old.sig == sig:
            old.at = now  # unchanged: keep the text read before
            return old
        fresh = _Checked(now, sig)
        self._cache.pop(path, None)
        self._cache[path] = fresh
        while len(self._cache) > self._entries:
            self._cache.pop(next(iter(self._cache)))
        return fresh
