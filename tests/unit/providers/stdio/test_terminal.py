"""Terminals: what the bridge keeps of terminals an agent created and never released."""

from __future__ import annotations

import asyncio
import gc
import os
import shutil
import signal
import tempfile
import weakref
from pathlib import Path
from typing import Any

import pytest

from tests.markers import both_loops, needs_bwrap
from xwm_bridge.config import AgentsConfig
from xwm_bridge.providers.stdio.agent import ClientError
from xwm_bridge.providers.stdio.terminal import MAX_EXITED, Terminals

pytestmark = pytest.mark.asyncio

TRUE = shutil.which("true") or "/bin/true"
#: the agent's environment a terminal starts from
ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}


@both_loops
async def test_exited_terminals_never_released_are_not_kept_for_ever(tmp_path: Path) -> None:
    terminals = Terminals(AgentsConfig(terminal_enabled=True))
    root = str(tmp_path)
    ids: list[str] = []
    try:
        for _ in range(MAX_EXITED + 3):  # each runs, exits and is never released
            created = await terminals.handle(
                "terminal/create", {"sessionId": "s", "command": TRUE}, root, ENV
            )
            tid = created["terminalId"]
            ids.append(tid)
            status = await terminals.handle(
                "terminal/wait_for_exit", {"sessionId": "s", "terminalId": tid}, root, ENV
            )
            assert status == {"exitCode": 0, "signal": None}
        for tid in ids[:3]:  # the oldest exited ones are gone
            with pytest.raises(ClientError, match="Resource not found"):
                await terminals.handle(
                    "terminal/output", {"sessionId": "s", "terminalId": tid}, root, ENV
                )
        for tid in ids[3:]:  # the newest are still there
            out = await terminals.handle(
                "terminal/output", {"sessionId": "s", "terminalId": tid}, root, ENV
            )
            assert out["exitStatus"] == {"exitCode": 0, "signal": None}
    finally:
        await terminals.close()


async def test_a_running_terminal_is_kept_however_many_exited_after_it(tmp_path: Path) -> None:
    terminals = Terminals(AgentsConfig(terminal_enabled=True, terminal_max_running=2))
    root = str(tmp_path)
    try:
        sleeper = await terminals.handle(
            "terminal/create", {"sessionId": "s", "command": "sleep", "args": ["30"]}, root, ENV
        )
        for _ in range(MAX_EXITED + 1):
            created = await terminals.handle(
                "terminal/create", {"sessionId": "s", "command": TRUE}, root, ENV
            )
            await terminals.handle(
                "terminal/wait_for_exit",
                {"sessionId": "s", "terminalId": created["terminalId"]},
                root,
                ENV,
            )
        out = await terminals.handle(
            "terminal/output", {"sessionId": "s", "terminalId": sleeper["terminalId"]}, root, ENV
        )
        assert "exitStatus" not in out  # still running, still there
    finally:
        await terminals.close()


@both_loops
@pytest.mark.parametrize(
    "env",
    [
        5,
        {"A": "b"},
        [{"name": "B=C", "value": "v"}],
        [{"name": "A", "value": "x\0y"}],
        [{"name": "", "value": "v"}],
        [{"name": "A\0B", "value": "v"}],
    ],
)
async def test_a_bad_env_is_invalid_params_on_both_loops(tmp_path: Path, env: Any) -> None:
    """A non-list ``env`` raised TypeError (an internal error, a traceback in the log);
    under uvloop a name with ``=`` was passed on (``B=C=v``: the child saw ``B``) and a
    NUL cut the string where asyncio's loop refused it."""
    terminals = Terminals(AgentsConfig(terminal_enabled=True))
    params = {"sessionId": "s", "command": TRUE, "env": env}
    try:
        with pytest.raises(ClientError) as caught:
            await terminals.handle("terminal/create", params, str(tmp_path), ENV)
    finally:
        await terminals.close()
    assert caught.value.code == -32602


@both_loops
@pytest.mark.parametrize("env", [None, [], {}, [{"name": "A", "value": "b"}, "skipped"]])
async def test_an_empty_or_good_env_is_taken(tmp_path: Path, env: Any) -> None:
    terminals = Terminals(AgentsConfig(terminal_enabled=True))
    params = {"sessionId": "s", "command": TRUE, "env": env}
    try:
        created = await terminals.handle("terminal/create", params, str(tmp_path), ENV)
    finally:
        await terminals.close()
    assert created["terminalId"].startswith("term-")


@both_loops
@pytest.mark.parametrize("command", [[TRUE], ["sleep", "30"]])
async def test_close_returns_once_every_command_has_exited_and_been_reaped(
    tmp_path: Path, command: list[str]
) -> None:
    """``close`` sent the kills and returned: the commands were reaped later, by a loop
    that may be gone by then (at the end of the agent's process, or of a test:
    asyncio's "Loop ... that handles pid N is closed"), and closing the transport of a
    command not reaped yet made asyncio's ``Popen.kill`` reap it under the child
    watcher ("Unknown child process pid N, will report returncode 255")."""
    terminals = Terminals(AgentsConfig(terminal_enabled=True))
    params = {"sessionId": "s", "command": command[0], "args": command[1:]}
    await terminals.handle("terminal/create", params, str(tmp_path), ENV)
    (term,) = terminals._terms.values()
    pid = term.pid
    await terminals.close()
    assert term.exited.done()
    assert term.returncode is not None and term.returncode != 255
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # reaped: not even a zombie


async def test_concurrent_creates_do_not_pass_the_running_cap_together(tmp_path: Path) -> None:
    """The cap was checked before the spawn was awaited and the terminal added after:
    creates arriving together (an agent serves 64 requests at once) all passed it."""
    terminals = Terminals(AgentsConfig(terminal_enabled=True, terminal_max_running=2))
    params = {"sessionId": "s", "command": "sleep", "args": ["30"]}
    try:
        outcomes = await asyncio.gather(
            *(terminals.handle("terminal/create", params, str(tmp_path), ENV) for _ in range(6)),
            return_exceptions=True,
        )
    finally:
        await terminals.close()
    created = [o for o in outcomes if isinstance(o, dict)]
    refused = [o for o in outcomes if isinstance(o, ClientError)]
    assert len(created) == 2, outcomes
    assert len(refused) == 4 and all("too many running" in r.message for r in refused)


async def test_a_command_killed_by_a_real_time_signal_reports_its_exit(tmp_path: Path) -> None:
    """``signal.Signals(40)`` raised ValueError: every ``terminal/output`` and
    ``wait_for_exit`` of such a command was an internal error with a traceback."""
    terminals = Terminals(AgentsConfig(terminal_enabled=True))
    root = str(tmp_path)
    params = {"sessionId": "s", "command": "/bin/sh", "args": ["-c", "kill -40 $$"]}
    try:
        created = await terminals.handle("terminal/create", params, root, ENV)
        ask = {"sessionId": "s", "terminalId": created["terminalId"]}
        status = await terminals.handle("terminal/wait_for_exit", ask, root, ENV)
        out = await terminals.handle("terminal/output", ask, root, ENV)
    finally:
        await terminals.close()
    rt = 40 - signal.SIGRTMIN
    assert status == {"exitCode": None, "signal": f"SIGRTMIN+{rt}"} == out["exitStatus"]


@needs_bwrap
async def test_a_sandboxed_terminals_cwd_swapped_after_the_check_writes_nothing_outside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``cwd`` swapped for a symlink out of the root after it was opened (a swap
    before is refused, as unsandboxed): bwrap takes ``--bind <cwd>`` and ``--chdir``
    by name, so the bind follows the symlink, but the root's bind after it covers
    that, so the symlink leads to the read-only outside and the command cannot write
    there."""
    from xwm_bridge.providers.stdio import terminal

    root = tmp_path / "work"
    (root / "sub").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    opener = terminal.open_dir

    def racing(base: Path, parts: tuple[str, ...]) -> int:
        fd = opener(base, parts)
        (root / "sub").rename(root / "sub.old")
        (root / "sub").symlink_to(outside)
        return fd

    monkeypatch.setattr(terminal, "open_dir", racing)
    terminals = Terminals(AgentsConfig(terminal_enabled=True, sandbox="bwrap"))
    params = {"sessionId": "s", "command": "/bin/sh", "args": ["-c", "echo x > escaped.txt"]}
    params["cwd"] = str(root / "sub")
    try:
        created = await terminals.handle("terminal/create", params, str(root), ENV)
        ask = {"sessionId": "s", "terminalId": created["terminalId"]}
        status = await terminals.handle("terminal/wait_for_exit", ask, str(root), ENV)
        out = await terminals.handle("terminal/output", ask, str(root), ENV)
    finally:
        await terminals.close()
    assert os.listdir(outside) == []
    assert status["exitCode"] != 0, out  # cannot chdir there, or a read-only file system


@needs_bwrap
async def test_a_sandboxed_cwd_swapped_for_a_relative_symlink_out_gets_no_writable_bind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The swap of the test above with a relative symlink (``../outside``), both dirs
    off ``/tmp`` (the sandbox's private ``/tmp`` hid the outside there): a ``--bind
    <cwd> <cwd>`` followed it on both sides and bound the outside read-write where the
    root's bind does not reach, and the command wrote there. Only the root is bound."""
    from xwm_bridge.providers.stdio import terminal

    base = Path(tempfile.mkdtemp(prefix="xwm-swap-", dir="/var/tmp"))
    try:
        root = base / "work"
        (root / "sub").mkdir(parents=True)
        outside = base / "outside"
        outside.mkdir()
        opener = terminal.open_dir

        def racing(top: Path, parts: tuple[str, ...]) -> int:
            fd = opener(top, parts)
            (root / "sub").rename(root / "sub.old")
            (root / "sub").symlink_to(Path("..") / "outside")
            return fd

        monkeypatch.setattr(terminal, "open_dir", racing)
        terminals = Terminals(AgentsConfig(terminal_enabled=True, sandbox="bwrap"))
        params = {"sessionId": "s", "command": "/bin/sh", "args": ["-c", "echo x > escaped"]}
        params["cwd"] = str(root / "sub")
        try:
            created = await terminals.handle("terminal/create", params, str(root), ENV)
            ask = {"sessionId": "s", "terminalId": created["terminalId"]}
            status = await terminals.handle("terminal/wait_for_exit", ask, str(root), ENV)
            out = await terminals.handle("terminal/output", ask, str(root), ENV)
        finally:
            await terminals.close()
        assert os.listdir(outside) == []
        assert status["exitCode"] != 0, out  # a read-only file system there
    finally:
        shutil.rmtree(base)


async def test_an_unsandboxed_terminals_cwd_swapped_after_the_check_runs_in_the_checked_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``cwd`` swapped for a symlink out of the root after the check: the command
    starts in the directory that was checked (held open by fd), never outside."""
    from xwm_bridge.providers.stdio import terminal

    root = tmp_path / "work"
    (root / "sub").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    check = terminal.resolve

    def racing(path: object, top: str | None) -> str:
        checked = check(path, top)
        (root / "sub").rename(root / "sub.old")
        (root / "sub").symlink_to(outside)
        return checked

    monkeypatch.setattr(terminal, "resolve", racing)
    terminals = Terminals(AgentsConfig(terminal_enabled=True))
    params = {"sessionId": "s", "command": "/bin/sh", "args": ["-c", "echo x > here.txt"]}
    params["cwd"] = str(root / "sub")
    try:
        with pytest.raises(ClientError, match="cwd"):
            await terminals.handle("terminal/create", params, str(root), ENV)
    finally:
        await terminals.close()
    assert os.listdir(outside) == []


def _points_at(fd: str, path: Path) -> bool:
    try:
        return os.readlink(f"/proc/self/fd/{fd}") == str(path)
    except OSError:
        return False


async def test_an_unsandboxed_terminal_starts_in_its_cwd_by_fd_and_leaks_no_fd(
    tmp_path: Path,
) -> None:
    """The cwd is opened (component by component, no symlink) and the child started
    there by that fd; the parent closes it after the spawn."""
    root = tmp_path / "work"
    (root / "a" / "b").mkdir(parents=True)
    terminals = Terminals(AgentsConfig(terminal_enabled=True))
    params = {"sessionId": "s", "command": "/bin/sh", "args": ["-c", "pwd -P > f.txt"]}
    params["cwd"] = str(root / "a" / "b")
    try:
        created = await terminals.handle("terminal/create", params, str(root), ENV)
        held = [fd for fd in os.listdir("/proc/self/fd") if _points_at(fd, root / "a" / "b")]
        ask = {"sessionId": "s", "terminalId": created["terminalId"]}
        status = await terminals.handle("terminal/wait_for_exit", ask, str(root), ENV)
        out = await terminals.handle("terminal/output", ask, str(root), ENV)
    finally:
        await terminals.close()
    assert status == {"exitCode": 0, "signal": None}, out
    assert (root / "a" / "b" / "f.txt").read_text() == f"{root / 'a' / 'b'}\n"
    assert not held, "the parent still holds the cwd open after the spawn"


async def test_a_cwd_swapped_after_it_was_opened_still_runs_in_the_opened_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from xwm_bridge.providers.stdio import terminal

    root = tmp_path / "work"
    (root / "sub").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    opener = terminal.open_dir

    def racing(base: Path, parts: tuple[str, ...]) -> int:
        fd = opener(base, parts)
        (root / "sub").rename(root / "sub.old")
        (root / "sub").symlink_to(outside)
        return fd

    monkeypatch.setattr(terminal, "open_dir", racing)
    terminals = Terminals(AgentsConfig(terminal_enabled=True))
    params = {"sessionId": "s", "command": "/bin/sh", "args": ["-c", "echo x > here.txt"]}
    params["cwd"] = str(root / "sub")
    try:
        created = await terminals.handle("terminal/create", params, str(root), ENV)
        ask = {"sessionId": "s", "terminalId": created["terminalId"]}
        status = await terminals.handle("terminal/wait_for_exit", ask, str(root), ENV)
    finally:
        await terminals.close()
    assert status == {"exitCode": 0, "signal": None}
    assert os.listdir(outside) == []
    assert (root / "sub.old" / "here.txt").read_text() == "x\n"


#: a command whose shell exits at once, leaving a background process (in its group)
#: holding its output pipe; it prints the background process's pid
LEAVES_A_SLEEP = {"command": "/bin/sh", "args": ["-c", "sleep 60 & echo $!"]}


async def _gone(pid: int, within: float = 5.0) -> bool:
    """Whether process ``pid`` (not a child: a pidfd tells its exit) exits within
    ``within`` seconds; a zombie counts as gone (its reaper may be the container's
    init, which may not reap)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    loop = asyncio.get_running_loop()
    exited = loop.create_future()
    loop.add_reader(fd, lambda: exited.done() or exited.set_result(None))
    try:
        await asyncio.wait_for(exited, within)
        return True
    except TimeoutError:
        return False
    finally:
        loop.remove_reader(fd)
        os.close(fd)


async def _start_and_wait(terminals: Terminals, root: str) -> tuple[str, dict[str, Any], int]:
    """A terminal whose shell leaves a background ``sleep``: its id, the status
    ``wait_for_exit`` answered (within 5 s, though ``prompt_timeout`` is longer) and
    the sleep's pid, read from ``terminal/output`` right after."""
    created = await terminals.handle(
        "terminal/create", {"sessionId": "s", **LEAVES_A_SLEEP}, root, ENV
    )
    ask = {"sessionId": "s", "terminalId": created["terminalId"]}
    async with asyncio.timeout(5):
        status = await terminals.handle("terminal/wait_for_exit", ask, root, ENV)
    out = await terminals.handle("terminal/output", ask, root, ENV)
    assert out["exitStatus"] == status
    return created["terminalId"], status, int(out["output"])


@both_loops
async def test_wait_for_exit_answers_when_the_command_exits_though_its_output_stays_open(
    tmp_path: Path,
) -> None:
    """``sh`` exits at once; the background ``sleep`` keeps the pipe open. The answer
    comes at the exit (not after ``prompt_timeout``), with the output written before."""
    terminals = Terminals(AgentsConfig(terminal_enabled=True, prompt_timeout=30))
    try:
        _, status, pid = await _start_and_wait(terminals, str(tmp_path))
        assert status == {"exitCode": 0, "signal": None}
        assert pid > 0
    finally:
        await terminals.close()


@both_loops
async def test_a_released_terminals_background_process_is_killed_and_nothing_kept(
    tmp_path: Path,
) -> None:
    terminals = Terminals(AgentsConfig(terminal_enabled=True, prompt_timeout=30))
    try:
        tid, _, pid = await _start_and_wait(terminals, str(tmp_path))
        term = weakref.ref(terminals._terms[tid])
        await terminals.handle("terminal/release", {"sessionId": "s", "terminalId": tid}, "", ENV)
        assert await _gone(pid), "the background sleep outlived the release"
        gc.collect()
        assert term() is None, "the released terminal is still referenced"
    finally:
        await terminals.close()


@both_loops
async def test_a_killed_terminals_background_process_is_killed(tmp_path: Path) -> None:
    terminals = Terminals(AgentsConfig(terminal_enabled=True, prompt_timeout=30))
    try:
        tid, _, pid = await _start_and_wait(terminals, str(tmp_path))
        await terminals.handle("terminal/kill", {"sessionId": "s", "terminalId": tid}, "", ENV)
        assert await _gone(pid), "the background sleep outlived terminal/kill"
        out = await terminals.handle(
            "terminal/output", {"sessionId": "s", "terminalId": tid}, "", ENV
        )
        assert out["exitStatus"] == {"exitCode": 0, "signal": None}  # the shell's, kept
    finally:
        await terminals.close()


@both_loops
async def test_background_processes_die_on_cancel_and_on_shutdown(tmp_path: Path) -> None:
    terminals = Terminals(AgentsConfig(terminal_enabled=True, prompt_timeout=30))
    try:
        _, _, cancelled = await _start_and_wait(terminals, str(tmp_path))
        terminals.kill_session("s")
        assert await _gone(cancelled), "the background sleep outlived the cancel"
        _, _, closed = await _start_and_wait(terminals, str(tmp_path))
    finally:
        await terminals.close()
    assert await _gone(closed), "the background sleep outlived the shutdown"


@both_loops
async def test_a_terminal_whose_background_process_lives_on_counts_as_running(
    tmp_path: Path,
) -> None:
    """Its shell exited, its group did not: it counts toward ``terminal_max_running``
    until killed or released."""
    root = str(tmp_path)
    config = AgentsConfig(terminal_enabled=True, prompt_timeout=30, terminal_max_running=1)
    terminals = Terminals(config)
    try:
        tid, _, _ = await _start_and_wait(terminals, root)
        with pytest.raises(ClientError, match="too many running terminals"):
            await terminals.handle(
                "terminal/create", {"sessionId": "s", "command": TRUE}, root, ENV
            )
        await terminals.handle("terminal/kill", {"sessionId": "s", "terminalId": tid}, root, ENV)
        created = await terminals.handle(
            "terminal/create", {"sessionId": "s", "command": TRUE}, root, ENV
        )
        await terminals.handle(
            "terminal/release", {"sessionId": "s", "terminalId": created["terminalId"]}, root, ENV
        )
        tid, _, _ = await _start_and_wait(terminals, root)
        await terminals.handle("terminal/release", {"sessionId": "s", "terminalId": tid}, root, ENV)
        await terminals.handle("terminal/create", {"sessionId": "s", "command": TRUE}, root, ENV)
    finally:
        await terminals.close()


@both_loops
async def test_wait_for_exit_past_prompt_timeout_kills_the_command(tmp_path: Path) -> None:
    terminals = Terminals(AgentsConfig(terminal_enabled=True, prompt_timeout=0.2))
    root = str(tmp_path)
    params = {"sessionId": "s", "command": "/bin/sh", "args": ["-c", "echo started; exec sleep 60"]}
    try:
        created = await terminals.handle("terminal/create", params, root, ENV)
        ask = {"sessionId": "s", "terminalId": created["terminalId"]}
        async with asyncio.timeout(5):
            status = await terminals.handle("terminal/wait_for_exit", ask, root, ENV)
        out = await terminals.handle("terminal/output", ask, root, ENV)
    finally:
        await terminals.close()
    assert status == {"exitCode": None, "signal": "SIGKILL"}
    assert out["output"] == "started\n"


async def test_wait_for_exit_is_bounded_after_the_kill_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the prompt timeout's SIGKILL the exit was awaited with no bound: a command
    the kill does not end at once (stuck in the kernel: a hung NFS mount) held the
    agent's request for ever. Here the first kill is lost, as if it had not taken."""
    from xwm_bridge.providers.stdio import terminal

    monkeypatch.setattr(terminal, "KILL_WAIT", 0.2, raising=False)
    lost = asyncio.Event()
    real_kill = terminal.Terminal.kill

    def kill_once_lost(self: terminal.Terminal) -> None:
        if not lost.is_set():
            lost.set()
            return
        real_kill(self)

    monkeypatch.setattr(terminal.Terminal, "kill", kill_once_lost)
    terminals = Terminals(AgentsConfig(terminal_enabled=True, prompt_timeout=0.2))
    root = str(tmp_path)
    params = {"sessionId": "s", "command": "sleep", "args": ["60"]}
    try:
        created = await terminals.handle("terminal/create", params, root, ENV)
        ask = {"sessionId": "s", "terminalId": created["terminalId"]}
        with pytest.raises(ClientError, match=r"did not exit within 0\.2s of its SIGKILL"):
            async with asyncio.timeout(5):
                await terminals.handle("terminal/wait_for_exit", ask, root, ENV)
    finally:
        await terminals.close()
    assert lost.is_set()


def _pids_running(argv: list[str]) -> list[int]:
    """Pids of the processes (no zombie) whose command line is ``argv``."""
    want = "\0".join(argv).encode() + b"\0"
    pids = []
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if f.read() == want:
                    pids.append(int(name))
        except (OSError, ValueError):
            continue
    return pids


@both_loops
@needs_bwrap
async def test_a_sandboxed_terminals_background_process_dies_with_it(tmp_path: Path) -> None:
    """Under bwrap the command is pid 1's child in a PID namespace of its own: when it
    exits, the namespace goes and its background processes with it, so the pipe
    closes at once and nothing outlives the exit, released or not."""
    marker = ["sleep", f"60.{os.getpid()}"]  # names it among the processes here
    params = {
        "sessionId": "s",
        "command": "/bin/sh",
        "args": ["-c", f"{' '.join(marker)} & echo $!"],
    }
    terminals = Terminals(AgentsConfig(terminal_enabled=True, sandbox="bwrap", prompt_timeout=30))
    root = str(tmp_path)
    try:
        created = await terminals.handle("terminal/create", params, root, ENV)
        ask = {"sessionId": "s", "terminalId": created["terminalId"]}
        async with asyncio.timeout(5):
            status = await terminals.handle("terminal/wait_for_exit", ask, root, ENV)
        out = await terminals.handle("terminal/output", ask, root, ENV)
        assert status == {"exitCode": 0, "signal": None}, out
        assert out["output"].strip().isdigit(), out
        left = _pids_running(marker)
        await terminals.handle("terminal/release", ask, root, ENV)
    finally:
        await terminals.close()
    assert all([await _gone(pid) for pid in left])
    assert left == [], "the background sleep outlived the sandboxed command"


async def test_a_group_number_a_live_process_has_is_never_taken_for_a_leftover_group() -> None:
    """After the command was reaped its number may go to a new process, which may lead
    a group of that number: a stranger's, never killed. (Ours: this process, the
    leader of no group of ours.)"""
    from xwm_bridge.procgroups import group_outlives

    assert not group_outlives(os.getpid())
    # a group led by a live process of its own number (pytest's own group may be led by
    # a shell that already exited, as under a CI runner: then it does outlive its leader)
    leader = await asyncio.create_subprocess_exec(
        "sleep", "30", start_new_session=True, stdin=asyncio.subprocess.DEVNULL
    )
    try:
        assert os.getpgid(leader.pid) == leader.pid
        assert not group_outlives(leader.pid)
    finally:
        leader.kill()
        await leader.wait()
