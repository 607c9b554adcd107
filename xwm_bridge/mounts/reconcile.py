"""``xworkmate.mounts.reconcile`` (adapters.md §4): inspect local agent tools
and optionally rewrite their managed MCP block.

Fixes of the original's weaknesses (adapters.md §4.5): only files under the
configured tool homes are touched (a client-sent ``codexHome`` etc. is used
only if it is that home or inside it, and then opened beneath it without following
a symlink: :class:`Home`), writes are atomic with a ``.bak``, the
TOML is produced and checked by ``tomlkit``, a malformed file is reported and
left untouched, and ``claude``/``gemini mcp list`` run only when enabled in
config, with a deadline and no shell.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from xwm_bridge import beneath, coerce, procgroups
from xwm_bridge.config import MountsConfig, without_secrets
from xwm_bridge.jsonrpc import INVALID_PARAMS, RpcError
from xwm_bridge.mounts import files
from xwm_bridge.mounts.managed import CODEX, OPENCODE, McpServer, MergeError, count_sections, merge
from xwm_bridge.tasks import wait_for

log = logging.getLogger("xwm_bridge.mounts")
#: what ``<cli> mcp list`` may print; reading stops there and the CLI is killed
MAX_CLI_OUTPUT = 1024 * 1024
#: seconds a CLI's output may take to end after it exited (a process it left holds it)
EXIT_GRACE = 0.5
#: ``<cli> mcp list`` commands running at once across the bridge's reconciles (the
#: places a caller passes in); one past it waits for a place within its deadline, else
#: counts nothing. Unbounded, each reconcile of every connection (256 in flight each)
#: started two processes
MAX_RUNNING_CLIS = 4
#: ``config.managedMcpServers`` items, ``args`` of one and ``args`` of all a request
#: may hold (past it: -32602). tomlkit renders tables and arrays in quadratic time:
#: 2,000 servers took 3 s, one server's 20,000 args 90 s, 256 servers of 256 args 13 s,
#: and a 4 MiB request's worth hours, in a worker thread holding the file's lock
MAX_MANAGED_SERVERS = 256
MAX_SERVER_ARGS = 256
MAX_TOTAL_ARGS = 1024


@dataclass(frozen=True, slots=True)
class Aris:
    available: bool = False
    bundle_version: str = ""
    llm_chat_server_path: str = ""
    skill_count: int = 0
    bridge_available: bool = False
    error: str = ""


@dataclass(frozen=True, slots=True)
class MountsRequest:
    auto_sync: bool = False
    uses_aris: bool = False
    servers: tuple[McpServer, ...] = ()
    ai_gateway_url: str = ""
    codex_cli_path: str = ""
    codex_home: str = ""
    opencode_home: str = ""
    openclaw_home: str = ""
    aris: Aris = field(default_factory=Aris)

    @classmethod
    def parse(cls, params: dict[str, Any]) -> MountsRequest:
        config = _obj(params.get("config"))
        aris = _obj(params.get("aris"))
        raw = config.get("managedMcpServers")
        servers: list[McpServer] = []
        total_args = 0
        for i, item in enumerate(raw if isinstance(raw, list) else []):
            if not isinstance(item, dict) or not coerce.text(item.get("id")):
                continue
            if len(servers) == MAX_MANAGED_SERVERS:
                raise RpcError(
                    INVALID_PARAMS,
                    f"config.managedMcpServers: at most {MAX_MANAGED_SERVERS} servers",
                )
            args = tuple(coerce.string_list(item.get("args")) or ())
            if len(args) > MAX_SERVER_ARGS:
                raise RpcError(
                    INVALID_PARAMS,
                    f"config.managedMcpServers[{i}].args: at most {MAX_SERVER_ARGS} items",
                )
            total_args += len(args)
            if total_args > MAX_TOTAL_ARGS:
                raise RpcError(
                    INVALID_PARAMS,
                    f"config.managedMcpServers: at most {MAX_TOTAL_ARGS} args in all",
                )
            servers.append(
                McpServer(
                    id=coerce.text(item.get("id")),
                    name=coerce.text(item.get("name")),
                    transport=coerce.text(item.get("transport")),
                    command=coerce.text(item.get("command")),
                    url=coerce.text(item.get("url")),
                    args=args,
                    enabled=coerce.flag(item.get("enabled"), True),
                )
            )
        return cls(
            auto_sync=coerce.flag(config.get("autoSync"), False),
            uses_aris=coerce.flag(config.get("usesAris"), False),
            servers=tuple(servers),
            ai_gateway_url=coerce.text(params.get("aiGatewayUrl")),
            codex_cli_path=coerce.path_text(
                params.get("configuredCodexCliPath"), "configuredCodexCliPath"
            ),
            codex_home=coerce.path_text(params.get("codexHome"), "codexHome"),
            opencode_home=coerce.path_text(params.get("opencodeHome"), "opencodeHome"),
            openclaw_home=coerce.path_text(params.get("openclawHome"), "openclawHome"),
            aris=Aris(
                available=coerce.flag(aris.get("available"), False),
                bundle_version=coerce.text(aris.get("bundleVersion")),
                llm_chat_server_path=coerce.path_text(
                    aris.get("llmChatServerPath"), "aris.llmChatServerPath"
                ),
                skill_count=coerce.positive_int(aris.get("skillCount")),
                bridge_available=coerce.flag(aris.get("bridgeAvailable"), False),
                error=coerce.text(aris.get("error")),
            ),
        )

    @property
    def enabled(self) -> list[McpServer]:
        return sorted((s for s in self.servers if s.enabled), key=lambda s: s.id)

    @property
    def codex_servers(self) -> list[McpServer]:
        return [s for s in self.enabled if s.command]


def _obj(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _target(target_id: str, label: str, injection: bool, mcp: bool = True) -> dict[str, Any]:
    return {
        "targetId": target_id,
        "label": label,
        "available": False,
        "supportsSkills": True,
        "supportsMcp": mcp,
        "supportsAiGatewayInjection": injection,
        "discoveryState": "missing",
        "syncState": "disabled",
        "discoveredSkillCount": 0,
        "discoveredMcpCount": 0,
        "managedMcpCount": 0,
        "detail": "",
    }


def aris_target(req: MountsRequest) -> dict[str, Any]:
    t = _target("aris", "ARIS", False)
    a = req.aris
    if a.error:
        t.update(discoveryState="error", syncState="error", detail=a.error)
    elif not a.available:
        t.update(syncState="missing", detail="Embedded ARIS bundle is unavailable.")
    else:
        llm_ready = bool(a.llm_chat_server_path)
        t.update(available=True, discoveryState="ready", discoveredSkillCount=a.skill_count)
        if req.uses_aris and llm_ready and a.bridge_available:
            t.update(
                syncState="ready",
                discoveredMcpCount=1,
                managedMcpCount=1,
                detail=f"Embedded bundle {a.bundle_version} ready; "
                "XWorkmate Go core manages llm-chat and claude-review.",
            )
        else:
            t.update(
                syncState="embedded",
                discoveredMcpCount=1 if llm_ready else 0,
                detail="Embedded bundle extracted, but the XWorkmate Go core is not available yet."
                if llm_ready
                else "Embedded bundle extracted, but llm-chat metadata is missing.",
            )
    return t


@dataclass(frozen=True, slots=True)
class Home:
    """A tool home in use: the configured one (resolved; trusted) and the directories
    below it that the client chose (checked: no ``..``, no symlink when resolved)."""

    base: Path
    parts: tuple[str, ...] = ()

    @property
    def path(self) -> Path:
        return self.base.joinpath(*self.parts)

    def open(self, create: bool = False) -> int:
        """Its directory's fd, every component below ``base`` opened without following
        a symlink (``beneath.py``): one swapped in since the check fails the open."""
        if create:
            self.base.mkdir(mode=0o755, parents=True, exist_ok=True)
        return beneath.open_dir(self.base, self.parts, create=create, mode=0o755)


def tool_home(configured: str, default_name: str, requested: str) -> tuple[Home | None, str]:
    """The home to use and a note when the client's choice was refused."""
    base = configured or (
        os.path.join(os.environ["HOME"], default_name) if os.environ.get("HOME") else ""
    )
    if not base or not os.path.isabs(base):
        return None, "tool home is not configured"
    home = files.real(base)
    if not requested:
        return Home(home), ""
    wanted = files.real(requested)
    if os.path.isabs(os.path.expanduser(requested)) and files.inside(wanted, home):
        return Home(home, wanted.relative_to(home).parts), ""
    return Home(home), f" ({requested} is outside the configured tool home; {home} was used)"


def _sync_file(
    t: dict[str, Any], home: Home | None, write: bool, servers: list[McpServer], flavor: str
) -> None:
    """Count and (when asked) rewrite ``<home>/config.toml``; runs in a worker thread."""
    if home is None:
        return
    path = home.path / "config.toml"
    if not write:
        with contextlib.suppress(OSError, UnicodeDecodeError), _opened(home) as dir_fd:
            t["discoveredMcpCount"] = count_sections(files.read_text(path, dir_fd))
        return
    try:
        with _opened(home, create=True) as dir_fd, files.Locked(path, dir_fd):
            existing = files.read_text(path, dir_fd)
            t["discoveredMcpCount"] = count_sections(existing)
            text = merge(existing, servers, flavor)
            previous = existing if files.exists(path, dir_fd) else None
            files.replace(path, text, previous, dir_fd)
    except MergeError as exc:
        t.update(syncState="error", detail=f"{path} left untouched: {exc}")
    except (OSError, UnicodeDecodeError) as exc:
        log.warning("mount config write failed", extra={"path": str(path), "error": str(exc)})
        t.update(syncState="error", detail=f"{path} could not be updated: {exc}")


@contextlib.contextmanager
def _opened(home: Home, create: bool = False) -> Iterator[int]:
    """:meth:`Home.open`, closed on exit."""
    fd = home.open(create)
    try:
        yield fd
    finally:
        os.close(fd)


def _codex_available(cli: str) -> bool:
    # an executable file, not any existing path (adapters.md §4.5)
    executable = bool(cli) and os.path.isfile(cli) and os.access(cli, os.X_OK)
    return executable or shutil.which("codex") is not None


async def codex_target(req: MountsRequest, cfg: MountsConfig) -> dict[str, Any]:
    t = _target("codex", "Codex", True)
    available = _codex_available(req.codex_cli_path)
    home, note = tool_home(cfg.codex_home, ".codex", req.codex_home)
    servers = req.codex_servers
    t.update(
        available=available,
        discoveryState="ready" if available else "missing",
        syncState="missing" if not available else "ready" if req.auto_sync else "disabled",
        managedMcpCount=len(servers),
        detail=(
            "LLM API uses launch-scoped defaults for collaboration runs."
            if req.ai_gateway_url
            else "LLM API not configured."
        )
        + note,
    )
    write = available and req.auto_sync and bool(servers)
    await asyncio.to_thread(_sync_file, t, home, write, servers, CODEX)
    return t


async def opencode_target(req: MountsRequest, cfg: MountsConfig) -> dict[str, Any]:
    t = _target("opencode", "OpenCode", True)
    available = shutil.which("opencode") is not None
    home, note = tool_home(cfg.opencode_home, ".opencode", req.opencode_home)
    servers = req.enabled
    t.update(
        available=available,
        discoveryState="ready" if available else "missing",
        syncState="missing" if not available else "ready" if req.auto_sync else "disabled",
        managedMcpCount=len(servers),
        detail="Managed MCP config is preserved in ~/.opencode/config.toml." + note,
    )
    write = available and req.auto_sync and bool(servers)
    await asyncio.to_thread(_sync_file, t, home, write, servers, OPENCODE)
    return t


def count_cli_servers(output: str) -> int:
    if not output.strip() or "No MCP servers configured" in output:
        return 0
    prefixes = ("Usage:", "┌", "│", "└")
    return sum(1 for line in output.splitlines() if line.strip() and not line.startswith(prefixes))


async def run_cli(exe: str, deadline: float, places: asyncio.Semaphore | None = None) -> str:
    """``<exe> mcp list``: stdout+stderr, no shell, killed at the deadline. Its output
    ends when it exits (a process it left may hold the pipe: read for
    :data:`EXIT_GRACE` more); nothing it started outlives the call. With ``places``
    (:data:`MAX_RUNNING_CLIS`) it first waits for one, within the same deadline."""
    if places is None:
        return await _run_cli(exe, deadline)
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline
    try:
        await wait_for(places.acquire(), deadline)
    except TimeoutError:
        log.warning("mount CLI discovery skipped: no free place", extra={"command": exe})
        return ""
    try:
        return await _run_cli(exe, max(0.0, end - loop.time()))
    finally:
        places.release()


async def _run_cli(exe: str, deadline: float) -> str:
    try:
        proc, watch = await procgroups.start(
            exe,
            "mcp",
            "list",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
            env=without_secrets(os.environ),  # a third-party CLI, and what it starts
        )
    except OSError:
        return ""
    assert proc.stdout is not None
    out = bytearray()
    try:
        async with asyncio.timeout(deadline), asyncio.TaskGroup() as tg:
            reading = tg.create_task(_read_capped(proc.stdout, out))
            exited = tg.create_task(watch.wait_exit())
            await asyncio.wait((reading, exited), return_when=asyncio.FIRST_COMPLETED)
            if not reading.done():  # it exited: a child it left may hold its stdout
                await asyncio.wait((reading,), timeout=EXIT_GRACE)
                reading.cancel()
            elif len(out) >= MAX_CLI_OUTPUT:  # a CLI that keeps printing is killed
                exited.cancel()
    except TimeoutError:  # asyncio.timeout's own, raised around the task group
        return ""
    finally:
        procgroups.kill_group(proc.pid, reaped=proc.returncode is not None)
        if proc.returncode is None:
            with contextlib.suppress(TimeoutError):
                await wait_for(watch.wait_exit(), 5)
        watch.close()
    return out[:MAX_CLI_OUTPUT].decode("utf-8", errors="replace")


async def _read_capped(stdout: asyncio.StreamReader, out: bytearray) -> None:
    """Into ``out``, no more than the cap (``MAX_CLI_OUTPUT``) and its last chunk."""
    while len(out) < MAX_CLI_OUTPUT and (chunk := await stdout.read(65536)):
        out += chunk


async def cli_target(
    name: str,
    label: str,
    req: MountsRequest,
    cfg: MountsConfig,
    places: asyncio.Semaphore | None = None,
) -> dict[str, Any]:
    t = _target(name, label, True)
    exe = shutil.which(name)
    available = exe is not None
    t.update(
        available=available,
        discoveryState="ready" if available else "missing",
        syncState="launch-only" if available and req.auto_sync else "disabled",
        managedMcpCount=len(req.enabled),
        detail=f"MCP discovery uses `{name} mcp list`; LLM API stays launch-scoped.",
    )
    if exe is not None and cfg.cli_discovery_enabled:
        output = await run_cli(exe, cfg.cli_timeout, places)
        t["discoveredMcpCount"] = count_cli_servers(output)
    return t


def _inspect_openclaw(t: dict[str, Any], home: Home | None) -> None:
    if home is None:
        return
    try:
        with _opened(home) as dir_fd:
            raw = files.read_text(home.path / "openclaw.json", dir_fd)
            skills = _count_entries(dir_fd, "skills") if raw else 0
    except (OSError, UnicodeDecodeError):
        return
    if not raw:
        return
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        doc = None
    if not isinstance(doc, dict):
        t["detail"] = "OpenClaw config detected but could not be fully parsed."
        return
    agents = _obj(doc.get("agents")).get("list")
    n_agents = len(agents) if isinstance(agents, list) else 0
    t["discoveredSkillCount"] = skills
    t["detail"] = f"agents: {n_agents} · skills: {t['discoveredSkillCount']}"


def _count_entries(dir_fd: int, name: str) -> int:
    """The entries of directory ``name`` in ``dir_fd`` (a symlink there is followed, as
    the home's own), 0 if it cannot be read; counted as listed, not held in a list."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return 0
    try:
        with os.scandir(fd) as entries:
            return sum(1 for _ in entries)
    except OSError:
        return 0
    finally:
        os.close(fd)


async def openclaw_target(req: MountsRequest, cfg: MountsConfig) -> dict[str, Any]:
    t = _target("openclaw", "OpenClaw", True, mcp=False)
    available = shutil.which("openclaw") is not None
    home, _ = tool_home(cfg.openclaw_home, ".openclaw", req.openclaw_home)
    t.update(
        available=available,
        discoveryState="ready" if available else "missing",
        syncState="launch-only" if available and req.auto_sync else "disabled",
        detail="OpenClaw acts as the host/control plane mount.",
    )
    await asyncio.to_thread(_inspect_openclaw, t, home)
    return t


async def reconcile(
    req: MountsRequest, cfg: MountsConfig, cli_places: asyncio.Semaphore | None = None
) -> dict[str, Any]:
    """§4.2 result; never fails at the JSON-RPC level. ``cli_places``: the bridge's
    places for discovery commands (:data:`MAX_RUNNING_CLIS`), shared by its reconciles."""
    aris = aris_target(req)
    codex, claude, gemini, opencode, openclaw = await asyncio.gather(
        codex_target(req, cfg),
        cli_target("claude", "Claude", req, cfg, cli_places),
        cli_target("gemini", "Gemini", req, cfg, cli_places),
        opencode_target(req, cfg),
        openclaw_target(req, cfg),
    )
    return {
        "mountTargets": [aris, codex, claude, gemini, opencode, openclaw],
        "arisBundleVersion": req.aris.bundle_version,
        "arisCompatStatus": aris["syncState"],
    }
