"""Permission policy for ``session/request_permission``: first matching rule wins.

A rule is ``{action: allow|reject|ask, kind: <glob>, path: <glob>, streamless: bool}``. ``kind`` is
matched against the ACP tool kind (``read``, ``edit``, ``delete``, ``move``,
``search``, ``execute``, ``think``, ``fetch``, ``other``); ``path`` against every
path of the tool call: its locations, the ``path`` of its ``diff`` content and each
``rawInput`` field named for a path (``destination``, ``new_path``, ``paths``, …), as
absolute paths and paths relative to the session's working directory. An ``allow``
rule matches only when every path does (a call that also names a path outside its glob
is not allowed by it), ``reject`` and ``ask`` rules when any path does. A rule whose
``path`` is ``*`` also matches a tool call without paths. A ``streamless: true`` rule
applies only to turns whose client cannot receive notifications (plain-JSON HTTP). No
rule matches → ``ask``.

Rules come from the config (``agents.permission_rules``) followed by an optional
YAML file (``agents.permission_rules_file``: a list of rules, or ``{rules: [...]}``)
that is re-read whenever its modification time or size changes.
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import os
from dataclasses import dataclass
from typing import Any

import yaml

from xwm_bridge import coerce
from xwm_bridge.config import PermissionRule
from xwm_bridge.tasks import wait_for

log = logging.getLogger("xwm_bridge.agents.policy")

ALLOW = "allow"
REJECT = "reject"
ASK = "ask"
ACTIONS = (ALLOW, REJECT, ASK)
#: seconds a permission request waits for the check of the rule file (then the rules
#: known so far decide)
RELOAD_WAIT = 2.0


@dataclass(frozen=True, slots=True)
class Decision:
    action: str
    rule: str  # which rule decided, for the audit log and the client

    @property
    def reason(self) -> str:
        return f"{self.action} by {self.rule}"


def parse_rules(data: Any, source: str) -> tuple[PermissionRule, ...]:
    """Validate a rule list; raise ValueError naming the bad entry."""
    if isinstance(data, dict):
        data = data.get("rules")
    if data is None:
        return ()
    if not isinstance(data, list):
        raise ValueError(f"{source}: expected a list of rules")
    rules = []
    for i, item in enumerate(data):
        if not isinstance(item, dict):
            raise ValueError(f"{source}[{i}]: expected an object")
        action = coerce.text(item.get("action")).lower()
        if action not in ACTIONS:
            raise ValueError(f"{source}[{i}].action: must be one of allow, reject, ask")
        streamless = item.get("streamless", False)
        if not isinstance(streamless, bool):
            raise ValueError(f"{source}[{i}].streamless: must be true or false")
        rules.append(
            PermissionRule(
                action=action,
                kind=coerce.text(item.get("kind"), "*"),
                path=coerce.text(item.get("path"), "*"),
                streamless=streamless,
            )
        )
    return tuple(rules)


# rawInput fields that name a path, besides every field whose name ends in ``path`` or
# ``paths`` (path, filePath, file_path, absolute_path, new_path, destinationPath, paths, …);
# names compared lower-case without ``_`` and ``-``
PATH_WORDS = frozenset(
    {"destination", "dest", "source", "target", "file", "files", "filename", "dir", "directory"}
)


def is_path_key(key: str) -> bool:
    """Whether a ``rawInput`` field's name says it holds a path (or a list of paths)."""
    name = key.lower().replace("_", "").replace("-", "")
    return name.endswith(("path", "paths")) or name in PATH_WORDS


def tool_paths(tool_call: dict[str, Any], cwd: str) -> list[str]:
    """Candidate paths of a tool call: locations, plus rawInput path-like fields."""
    return [form for forms in tool_locations(tool_call, cwd) for form in forms]


def tool_locations(tool_call: dict[str, Any], cwd: str) -> list[tuple[str, ...]]:
    """Each path of a tool call (locations, the ``path`` of ``diff`` content, and every
    ``rawInput`` field named for a path: ``is_path_key``) in the
    forms a rule's glob is matched against: absolute, and relative to ``cwd`` when
    inside it."""
    found: list[str] = []
    locations = tool_call.get("locations")
    if isinstance(locations, list):
        for loc in locations:
            if isinstance(loc, dict) and isinstance(loc.get("path"), str):
                found.append(loc["path"])
    content = tool_call.get("content")
    if isinstance(content, list):  # a diff names the file it changes
        for item in content:
            diff = isinstance(item, dict) and item.get("type") == "diff"
            if diff and isinstance(item.get("path"), str):
                found.append(item["path"])
    raw = tool_call.get("rawInput")
    if isinstance(raw, dict):
        for key, value in raw.items():
            if not (isinstance(key, str) and is_path_key(key)):
                continue
            if isinstance(value, str):
                found.append(value)
            elif isinstance(value, list):
                found.extend(v for v in value if isinstance(v, str))
    out: list[tuple[str, ...]] = []
    for p in found:
        absolute = os.path.normpath(p if os.path.isabs(p) else os.path.join(cwd or "/", p))
        if cwd and absolute.startswith(cwd.rstrip("/") + "/"):
            out.append((absolute, os.path.relpath(absolute, cwd)))
        else:
            out.append((absolute,))
    return out


def _path_matches(rule: PermissionRule, locations: list[tuple[str, ...]]) -> bool:
    """An ``allow`` rule needs every path of the call to match (a call that also
    touches a path outside the glob is not allowed by it); ``reject`` and ``ask``
    rules match when any path does."""
    if rule.path == "*":
        return True
    hits = [any(fnmatch.fnmatchcase(form, rule.path) for form in forms) for forms in locations]
    if not hits:
        return False
    return all(hits) if rule.action == ALLOW else any(hits)


def decide(
    rules: tuple[PermissionRule, ...],
    tool_call: dict[str, Any],
    cwd: str,
    streamless: bool = False,
) -> Decision:
    """``streamless``: the turn's client cannot receive notifications (plain-JSON HTTP);
    rules marked ``streamless`` apply only then."""
    kind = coerce.text(tool_call.get("kind"), "other")
    locations = tool_locations(tool_call, cwd)
    for i, rule in enumerate(rules):
        if rule.streamless and not streamless:
            continue
        if not fnmatch.fnmatchcase(kind, rule.kind):
            continue
        if _path_matches(rule, locations):
            extra = ", streamless" if rule.streamless else ""
            return Decision(
                rule.action, f"rule {i + 1} (kind={rule.kind}, path={rule.path}{extra})"
            )
    return Decision(ASK, "default")


def read_rules(path: str) -> tuple[PermissionRule, ...]:
    """The rules of the file at ``path``; OSError, ValueError or YAMLError when it
    cannot be read or is not a rule list."""
    with open(path, encoding="utf-8") as fh:
        return parse_rules(yaml.safe_load(fh), path)


class PolicyStore:
    """Inline rules + a rule file reloaded on change."""

    def __init__(self, inline: tuple[PermissionRule, ...], path: str = "") -> None:
        self._inline = inline
        self._path = path
        self._stamp: tuple[float, int] | None = None
        self._file_rules: tuple[PermissionRule, ...] = ()
        #: the check of the rule file in flight (a worker thread's), if any
        self._reload: asyncio.Future[None] | None = None
        if path:  # read at start: a wrong path is said now, not never
            self._maybe_reload()
            if self._stamp is None:
                log.warning(
                    "permission rule file not found",
                    extra={"path": path, "hint": "its rules apply once it exists"},
                )

    async def _refresh(self) -> None:
        """The rule file checked (and read again when it changed) in a worker thread, one
        check at a time, waited for at most :data:`RELOAD_WAIT`: on the event loop, a rule
        file on a hung NFS mount froze every session at each permission request; past the
        wait the rules known so far decide, and the check goes on on its own."""
        if self._reload is None or self._reload.done():
            loop = asyncio.get_running_loop()
            self._reload = loop.run_in_executor(None, self._maybe_reload)
        try:
            await wait_for(asyncio.shield(self._reload), RELOAD_WAIT)
        except TimeoutError:
            log.warning(
                "permission rule file check is slow; the rules known so far decide",
                extra={"path": self._path, "waited_s": RELOAD_WAIT},
            )

    def _maybe_reload(self) -> None:
        try:
            st = os.stat(self._path)
        except OSError:
            if self._stamp is not None:
                log.warning("permission rule file vanished", extra={"path": self._path})
            self._stamp, self._file_rules = None, ()
            return
        stamp = (st.st_mtime, st.st_size)
        if stamp == self._stamp:
            return
        self._stamp = stamp
        try:
            self._file_rules = read_rules(self._path)
            log.info("permission rules loaded", extra={"path": self._path})
        except (OSError, ValueError, yaml.YAMLError) as exc:
            # keep the previous rules: a half-written file must not open the gates
            log.warning("permission rule file rejected", extra={"error": str(exc)})

    async def decide(
        self, tool_call: dict[str, Any], cwd: str, streamless: bool = False
    ) -> Decision:
        if self._path:
            await self._refresh()
        return decide(self._inline + self._file_rules, tool_call, cwd, streamless)
