"""Skill resolution (routing.md §4): explicit, local match, finder, installed
match, and the install-approval request-id flow.

The resolution steps are pure (:func:`resolve_skills` takes the finder and
installer as async callables). :class:`SkillCommands` runs the configured
finder/installer executables: only when enabled in config, argv from config
(never from the client), no shell, a deadline after which the process group is
killed, and a cap on the output read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson

from xwm_bridge import coerce, procgroups
from xwm_bridge.config import without_secrets
from xwm_bridge.router import keywords
from xwm_bridge.tasks import wait_for

log = logging.getLogger("xwm_bridge.skills")
#: once a skill command has exited, how long a child it left holding its stdout may
#: keep the pipe open before the command's process group is killed
EXIT_GRACE = 0.5
#: skill commands (finder, installer) running at once; a call past it waits for a place
#: within the command timeout, else finds nothing (logged)
MAX_RUNNING_COMMANDS = 4

LOCAL_MATCH, FIND_SKILLS, NONE = "local_match", "find_skills", "none"


@dataclass(frozen=True, slots=True)
class SkillCandidate:
    id: str = ""
    label: str = ""
    description: str = ""
    installed: bool = False

    def wire(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "label": self.label,
            "description": self.description,
            "installed": self.installed,
        }

    @property
    def display(self) -> str:
        return self.label.strip() or self.id.strip()


# fmt: off
CATALOG: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("pptx", "pptx", ("ppt", "pptx", "powerpoint", "slides", "幻灯片", "演示文稿")),
    ("docx", "docx", ("docx", "word", "word document", "文档")),
    ("xlsx", "xlsx", ("xlsx", "excel", "spreadsheet", "表格", "工作表")),
    ("pdf", "pdf", ("pdf", "表单", "merge pdf", "split pdf")),
    (
        "image-resizer",
        "image-resizer",
        ("image-resizer", "resize image", "compress image", "crop image", "批量图片"),
    ),
    ("image-cog", "image-cog", ("image-cog", "文生图", "图生图", "角色一致性")),
    (
        "image-video-generation-editting",
        "image-video-generation-editting",
        ("wan", "文生视频", "图生视频", "视频生成", "视频编辑"),
    ),
    (
        "video-translator",
        "video-translator",
        ("video-translator", "视频翻译", "配音", "字幕翻译", "translate video", "dub video",
         "subtitles"),
    ),
    (
        "browser-automation",
        "Browser Automation",
        ("browser", "跨浏览器", "浏览器", "web scraping", "资讯采集", "search", "搜索", "news",
         "资讯"),
    ),
    ("find-skills", "find_skills", ("find skills", "find_skills", "技能包", "skill package")),
)
# fmt: on


@dataclass(frozen=True, slots=True)
class SkillResult:
    resolved: tuple[str, ...] = ()
    candidates: tuple[SkillCandidate, ...] = ()
    source: str = NONE
    needs_install: bool = False
    install_request_id: str = ""


NO_SKILLS = SkillResult(source=NONE)


@dataclass(frozen=True, slots=True)
class InstallApproval:
    request_id: str = ""
    approved_keys: tuple[str, ...] = ()


Finder = Callable[[str], Awaitable[list[SkillCandidate]]]
Installer = Callable[[list[SkillCandidate]], Awaitable[list[SkillCandidate]]]


def normalize(value: str) -> str:
    return value.strip().lower()


def dedupe_strings(values: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    seen: set[str] = set()
    out: list[str] = []
    for v in values:
        v = v.strip()
        if v and v.lower() not in seen:
            seen.add(v.lower())
            out.append(v)
    return tuple(out)


_IN_CATALOG = keywords.Matcher(tuple(kw for _, _, kws in CATALOG for kw in kws))


def dedupe_candidates(items: list[SkillCandidate]) -> list[SkillCandidate]:
    seen: set[str] = set()
    out: list[SkillCandidate] = []
    for c in items:
        key = normalize(f"{c.id}|{c.label}")
        if key == "|" or key in seen:
            continue
        seen.add(key)
        out.append(c)
    return out


def candidate_keywords(c: SkillCandidate) -> list[str]:
    words = [normalize(c.id), normalize(c.label)]
    haystack = normalize(f"{c.id} {c.label}")
    for cid, label, kws in CATALOG:
        if normalize(cid) in haystack or normalize(label) in haystack:
            words += list(kws)
    return [w for w in dedupe_strings(words) if w]


def static_find(prompt: str) -> list[SkillCandidate]:
    if not _IN_CATALOG(prompt):  # the common case: one regex search
        return []
    lowered = prompt.lower()
    return [
        SkillCandidate(id=cid, label=label)
        for cid, label, kws in CATALOG
        if keywords.any_in(lowered, kws)
    ]


def _installed_match(f: SkillCandidate, available: list[SkillCandidate]) -> str:
    wanted = candidate_keywords(f)
    for a in available:
        joined = " ".join(candidate_keywords(a))
        if any(keywords.contains(joined, kw) for kw in wanted):
            return a.display
    return ""


def install_request_id(unmatched: list[SkillCandidate]) -> str:
    keys = sorted({normalize(c.id) or normalize(c.label) for c in unmatched} - {""})
    return "skill-install:" + ",".join(keys) if keys else ""


async def resolve_skills(
    prompt: str,
    explicit: tuple[str, ...],
    available_raw: list[SkillCandidate],
    allow_install: bool,
    approval: InstallApproval,
    finder: Finder | None,
    installer: Installer,
) -> SkillResult:
    """§4.3 steps 1–8 (``finder`` None: no finder command is configured)."""
    if explicit:
        forced = dedupe_strings(explicit)
        if forced:
            return SkillResult(resolved=forced, source=LOCAL_MATCH)
    available = dedupe_candidates(available_raw) if available_raw else []
    if available and prompt.strip():
        lowered = prompt.lower()  # once, not once per candidate (a prompt may be MiBs)
        local = [a.display for a in available if keywords.any_in(lowered, candidate_keywords(a))]
        matched = dedupe_strings(local)
        if matched:
            return SkillResult(resolved=matched, source=LOCAL_MATCH)
    found = (await finder(prompt) if finder is not None else []) or static_find(prompt)
    if not found:
        return NO_SKILLS
    found = dedupe_candidates(found)
    matches = [_installed_match(f, available) for f in found]
    if any(matches):
        return SkillResult(
            resolved=dedupe_strings(matches), candidates=tuple(found), source=FIND_SKILLS
        )
    unmatched = found  # no candidate matched (step 5 returned otherwise)
    request_id = install_request_id(unmatched)
    approved_keys = {normalize(k) for k in dedupe_strings(approval.approved_keys)}
    if (
        allow_install
        and request_id
        and approval.request_id.strip() == request_id
        and approved_keys
        and unmatched
    ):
        approved = [c for c in unmatched if normalize(c.id) in approved_keys]
        if approved:
            installed = dedupe_candidates(await installer(approved))
            if installed:
                merged = dedupe_candidates(available + installed)
                resolved = dedupe_strings([_installed_match(f, merged) for f in found])
                if resolved:
                    return SkillResult(
                        resolved=resolved,
                        candidates=tuple(dedupe_candidates(found + installed)),
                        source=FIND_SKILLS,
                    )
    return SkillResult(
        candidates=tuple(found),
        source=FIND_SKILLS,
        needs_install=True,
        install_request_id=request_id,
    )


# --- command output (§4.4) ------------------------------------------------------------------


def candidate_from(
    item: Any, *, installed: Callable[[Any], bool] = coerce.loose_bool
) -> SkillCandidate:
    """A client's ``availableSkills`` item (``installed``: loose bool), or with
    ``installed=coerce.frame_bool`` one of a skill command's candidates (routing.md §4.4)."""
    if not isinstance(item, dict):
        return SkillCandidate()
    return SkillCandidate(
        id=coerce.text(item.get("id")),
        label=coerce.text(item.get("label")),
        description=coerce.text(item.get("description")),
        installed=installed(item.get("installed")),
    )


def parse_command_output(stdout: bytes) -> list[SkillCandidate]:
    """stdout → candidates; anything malformed means no candidates."""
    try:
        doc = orjson.loads(stdout)
    except orjson.JSONDecodeError:
        return []
    if isinstance(doc, list):
        doc = {"candidates": doc}
    if not isinstance(doc, dict):
        return []
    items: Any
    if "candidates" in doc:
        items = doc["candidates"]
    elif "skills" in doc:
        items = doc["skills"]
    else:
        single = candidate_from(doc, installed=coerce.frame_bool)
        return [single] if (single.id or single.label) else []
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        return []
    return dedupe_candidates([candidate_from(i, installed=coerce.frame_bool) for i in items])


class SkillCommands:
    """Runs the configured finder/installer; disabled ones return no candidates."""

    def __init__(
        self,
        *,
        enabled: bool,
        find_bin: str,
        install_bin: str,
        timeout: float,
        max_output: int,
    ) -> None:
        self._enabled = enabled
        self._find = find_bin
        self._install = install_bin
        self._timeout = timeout
        self._max_output = max_output
        self._places = asyncio.Semaphore(MAX_RUNNING_COMMANDS)

    @property
    def finds(self) -> bool:
        """A finder command is configured (it may still fail to resolve at run time)."""
        return self._enabled and bool(self._find)

    async def find(self, prompt: str) -> list[SkillCandidate]:
        return await self._run(self._find, {"prompt": prompt.strip()})

    async def install(self, approved: list[SkillCandidate]) -> list[SkillCandidate]:
        return await self._run(self._install, {"candidates": [c.wire() for c in approved]})

    def _executable(self, name: str) -> str | None:
        if not self._enabled or not name:
            return None
        if os.sep in name:
            return name if os.path.isfile(name) and os.access(name, os.X_OK) else None
        return shutil.which(name)

    async def _run(self, name: str, payload: dict[str, Any]) -> list[SkillCandidate]:
        exe = self._executable(name)
        if exe is None:
            return []
        try:
            await wait_for(self._places.acquire(), self._timeout)
        except TimeoutError:
            log.warning(
                "skill command not run: others took every place",
                extra={"command": exe, "running": MAX_RUNNING_COMMANDS},
            )
            return []
        try:
            return await self._run_one(exe, payload)
        finally:
            self._places.release()

    async def _run_one(self, exe: str, payload: dict[str, Any]) -> list[SkillCandidate]:
        try:
            proc, watch = await procgroups.start(
                exe,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.DEVNULL,
                start_new_session=True,
                env=without_secrets(os.environ),
            )
        except OSError as exc:
            log.warning("skill command failed to start", extra={"command": exe, "error": str(exc)})
            return []
        try:
            stdout = await wait_for(self._exchange(proc, watch, payload), self._timeout)
        except TimeoutError:
            log.warning("skill command timed out", extra={"command": exe})
            return []
        finally:
            await _reap(proc, watch)
        if proc.returncode != 0 or stdout is None:
            return []
        return parse_command_output(stdout)

    async def _exchange(
        self, proc: asyncio.subprocess.Process, watch: procgroups.Watch, payload: dict[str, Any]
    ) -> bytes:
        assert proc.stdout is not None
        chunks: list[bytes] = []
        async with asyncio.TaskGroup() as tg:
            # fed while its output is read: a command that writes more than a pipe holds
            # before it reads all of a prompt larger than one held its write while the
            # bridge held its drain, until the timeout, and found nothing
            feeding = tg.create_task(_feed(proc, orjson.dumps(payload)))
            reading = tg.create_task(self._read(proc.stdout, chunks))
            exited = tg.create_task(watch.wait_exit())  # not proc.wait(): its pipes too
            await asyncio.wait((reading, exited), return_when=asyncio.FIRST_COMPLETED)
            if not reading.done():  # it exited: a child it left may hold its stdout open
                await asyncio.wait((reading,), timeout=EXIT_GRACE)
            if not reading.done() or not reading.result():
                _kill_group(proc)  # that child, or a command that wrote too much
            if not reading.done():
                # held by a process outside its group (a session of its own: no kill
                # reaches it); what the command wrote before it exited has been read
                await asyncio.wait((reading,), timeout=EXIT_GRACE)
                reading.cancel()
            feeding.cancel()  # the output is read: the rest of the prompt is moot
        if not reading.cancelled() and not reading.result():
            return b""  # too large: treated as malformed
        return b"".join(chunks)

    async def _read(self, stdout: asyncio.StreamReader, chunks: list[bytes]) -> bool:
        """The whole output, into ``chunks``; False past ``max_output``."""
        size = 0
        while chunk := await stdout.read(65536):
            size += len(chunk)
            if size > self._max_output:
                return False
            chunks.append(chunk)
        return True


async def _feed(proc: asyncio.subprocess.Process, data: bytes) -> None:
    """Write the prompt to the command's stdin and close it."""
    assert proc.stdin is not None
    try:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            # a command that exited without reading its stdin: the loop may have closed
            # the pipe already, and uvloop's write then raises RuntimeError (its answer
            # is still on stdout)
            if not proc.stdin.is_closing():
                proc.stdin.write(data)
                await proc.stdin.drain()
    finally:
        proc.stdin.close()


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL the command's process group: it and whatever it started (its own
    session), also once the command itself has exited (while the group has members:
    never a number that may be a stranger's by now)."""
    procgroups.kill_group(proc.pid, reaped=proc.returncode is not None)


async def _reap(proc: asyncio.subprocess.Process, watch: procgroups.Watch) -> None:
    _kill_group(proc)  # nothing it started outlives the call
    if proc.returncode is None:
        with contextlib.suppress(TimeoutError):
            await wait_for(watch.wait_exit(), 5)
    watch.close()  # its pipes, also when a process outside its group holds them
