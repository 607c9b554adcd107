"""Routing memory (routing.md §6) in a temp home: locations confined to roots,
sanitization, the case-insensitive parse fix, round trips, rotation, failures."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from xwm_bridge.config import BridgeConfig, RouterConfig
from xwm_bridge.router import memory, memory_write
from xwm_bridge.router.resolver import RoutingRequest
from xwm_bridge.router.service import Router


def test_parse_fixes_capitalized_prefixes() -> None:
    part = memory.parse(
        "Preferred-Route: Gateway-Chat\nPREFERRED-MODEL:  gpt-5 \nProvider: Codex\n"
        "preferred-skills: a, , b\npreferred-skills: c"
    )
    assert (part.route, part.model, part.provider) == ("gateway", "gpt-5", "Codex")
    assert part.skills == ["a", "b", "c"]


def test_later_lines_replace_earlier_ones() -> None:
    part = memory.parse("preferred-route: gateway\n# heading\nprose\npreferred-route: multi-agent")
    assert part.route == "multi-agent"


def test_sanitize_drops_secret_lines() -> None:
    text = "provider: codex\nmy api_key: x\n\nToken=abc\npassword: p\nAPI KEY here\nsecret\nok"
    assert memory.sanitize(text) == "provider: codex\n\nok"


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_load_merges_scopes_in_order(tmp_path: Path) -> None:
    home, projects = tmp_path / "home", tmp_path / "projects"
    wd = projects / "app"
    write(home / "self-improving" / "memory.md", "preferred-route: gateway\nprovider: gemini\n")
    write(
        home / "self-improving" / "projects" / "app.md",
        "preferred-model: m1\npreferred-skills: a, b\n",
    )
    write(wd / ".xworkmate" / "memory.md", "preferred-route: single-agent\npreferred-skills: c\n")
    locs = memory.locate(str(wd), str(home), (str(projects),))
    prefs = memory.load(locs, 4096)
    assert (prefs.route, prefs.model, prefs.provider) == ("single-agent", "m1", "gemini")
    assert prefs.skills == ("c",)
    assert [s.scope for s in prefs.sources] == ["global", "project-home", "project-local"]


def test_project_local_requires_allowed_root(tmp_path: Path) -> None:
    home = tmp_path / "home"
    wd = tmp_path / "elsewhere" / "app"
    write(wd / ".xworkmate" / "memory.md", "preferred-route: gateway\n")
    locs = memory.locate(str(wd), str(home), (str(tmp_path / "projects"),))
    assert locs.project_local_dir is None
    assert memory.load(locs, 4096).route == ""


@pytest.mark.parametrize("wd", ["", "relative/app", "/", "/x/..", "  "])
def test_odd_working_directories_read_no_project_files(wd: str, tmp_path: Path) -> None:
    locs = memory.locate(wd, str(tmp_path), (str(tmp_path),) if wd.startswith("/x") else ())
    assert all(".." not in str(p) for _, p in locs.reads())
    assert locs.project_local_dir is None or locs.project_local_dir.is_relative_to(tmp_path)
    if not wd.strip():
        assert [s for s, _ in locs.reads()] == ["global"]


def test_dotdot_cannot_escape_root(tmp_path: Path) -> None:
    root = tmp_path / "projects"
    root.mkdir()
    locs = memory.locate(str(root / ".." / "outside"), str(tmp_path / "h"), (str(root),))
    assert locs.project_local_dir is None


def test_symlink_escape_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "projects"
    outside = tmp_path / "outside"
    write(outside / ".xworkmate" / "memory.md", "preferred-route: gateway\n")
    root.mkdir()
    (root / "link").symlink_to(outside)
    locs = memory.locate(str(root / "link"), str(tmp_path / "h"), (str(root),))
    assert locs.project_local_dir is None


def test_render_block_format() -> None:
    now = datetime(2026, 4, 12, 10, 15, 30, tzinfo=timezone(timedelta(hours=8)))
    block = memory_write.render_block("single-agent", "gpt-5.4", ("PPTX", "pdf"), "codex", now)
    assert block == (
        "\n## Auto route 2026-04-12T10:15:30+08:00\npreferred-route: single-agent\n"
        "preferred-model: gpt-5.4\npreferred-skills: PPTX, pdf\nprovider: codex\n"
    )
    assert memory_write.render_block("multi-agent", "", (), "", now).count("\n") == 3


def test_render_block_writes_utc_as_z() -> None:
    # examples.md §5: a bridge on UTC writes Go's RFC 3339 form, 10:15:30Z
    now = datetime(2026, 4, 12, 10, 15, 30, tzinfo=timezone(timedelta(0)))
    block = memory_write.render_block("single-agent", "", ("PPTX",), "codex", now)
    assert block.startswith("\n## Auto route 2026-04-12T10:15:30Z\n")


def test_render_block_cannot_inject_lines() -> None:
    block = memory_write.render_block("single-agent", "m\nprovider: evil", (), "")
    assert "\nprovider: evil" not in block


@pytest.mark.parametrize("sep", ["\v", "\f", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"])
def test_render_block_cannot_inject_lines_with_other_line_breaks(sep: str) -> None:
    # parse() splits with str.splitlines, which also breaks at these: a client's
    # explicitModel (recorded on auto turns) carried a preference line of its own
    model = f"gpt{sep}preferred-route: gateway"
    block = memory_write.render_block("single-agent", model, (f"a{sep}provider: evil",), "")
    part = memory.parse(memory.sanitize(block))
    assert (part.route, part.provider) == ("single-agent", "")
    assert part.model == "gpt preferred-route: gateway"
    assert len(block.splitlines()) == 5  # blank, heading, route, model, skills


def test_append_rotates_above_cap(tmp_path: Path) -> None:
    path = tmp_path / "p" / "memory.md"
    for _ in range(10):
        memory_write.append(path, "x" * 40 + "\n", 100)
    assert path.stat().st_size <= 100
    assert (tmp_path / "p" / "memory.md.1").exists()
    assert oct(path.stat().st_mode & 0o777) == "0o644"


def test_a_rotation_carries_the_preferences_over(tmp_path: Path) -> None:
    """A rotation moved the whole file to ``memory.md.1``, which nothing reads: the
    preferences written by hand at its top (and the skills recorded before) stopped
    applying at once. The fresh file now starts with what the old one said."""
    path = tmp_path / "p" / "memory.md"
    write(path, "# team notes\npreferred-model: hand-picked\nprovider: acme\napi_key: sk-x\n")
    memory_write.append(path, memory_write.render_block("single-agent", "", ("pdf",), ""), 4096)
    for _ in range(100):  # past the cap: rotated
        memory_write.append(path, memory_write.render_block("single-agent", "", (), ""), 4096)
    assert (tmp_path / "p" / "memory.md.1").exists()
    fresh = path.read_text()
    assert "api_key" not in fresh and "team notes" not in fresh  # sanitized, parsed only
    part = memory.parse(memory.sanitize(fresh))
    assert (part.model, part.provider, part.skills) == ("hand-picked", "acme", ["pdf"])
    assert part.route == "single-agent"
    assert path.stat().st_size <= 4096


def test_concurrent_appends_do_not_interleave(tmp_path: Path) -> None:
    path = tmp_path / "memory.md"
    blocks = [f"\n## block {i}\n" + f"line-{i}\n" * 50 for i in range(8)]
    threads = [threading.Thread(target=memory_write.append, args=(path, b, 10**7)) for b in blocks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    text = path.read_text()
    for b in blocks:
        assert b in text


def test_append_refuses_symlinked_file(tmp_path: Path) -> None:
    target = tmp_path / "victim"
    target.write_text("")
    link = tmp_path / "d" / "memory.md"
    link.parent.mkdir()
    link.symlink_to(target)
    with pytest.raises(OSError):
        memory_write.append(link, "x\n", 1000)
    assert target.read_text() == ""


@pytest.mark.parametrize("reader", [False, True])
def test_append_refuses_a_fifo_without_blocking(tmp_path: Path, reader: bool) -> None:
    """Reads skipped a FIFO, appends did not: open(O_WRONLY) on one waits for a reader,
    so a FIFO at <wd>/.xworkmate/memory.md held the turn's reply and a worker thread
    for ever (and, with one reading it, memory blocks went down the pipe)."""
    fifo = tmp_path / "memory.md"
    os.mkfifo(fifo)
    held = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK) if reader else -1
    pool = ThreadPoolExecutor(1)
    future = pool.submit(memory_write.append, fifo, "preferred-route: gateway\n", 1000)
    try:
        error = future.exception(timeout=10)  # TimeoutError here: append blocked
        assert isinstance(error, OSError)
        if reader:
            assert os.read(held, 100) == b""  # nothing was written into the pipe
    finally:
        if not future.done():  # release the blocked writer so the thread can end
            os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
        if held >= 0:
            os.close(held)
        pool.shutdown()


def test_append_waits_for_a_stuck_lock_holder_only_until_its_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A blocking flock(LOCK_EX) had no deadline: another writer that held the file's
    lock (a stuck process, a hung NFS server) kept the turn's reply and a worker thread
    waiting for ever. The append now fails with a clear error at memory_write.LOCK_TIMEOUT,
    and writes nothing."""
    import fcntl

    monkeypatch.setattr(memory_write, "LOCK_TIMEOUT", 0.2, raising=False)
    target = tmp_path / "memory.md"
    target.write_text("")
    holder = os.open(target, os.O_RDONLY)  # its own open file description: its own lock
    fcntl.flock(holder, fcntl.LOCK_EX)
    pool = ThreadPoolExecutor(1)
    future = pool.submit(memory_write.append, target, "preferred-route: gateway\n", 1000)
    try:
        error = future.exception(timeout=10)  # TimeoutError here: append blocked
        assert isinstance(error, TimeoutError)
        assert "locked by another writer" in str(error)
        assert target.read_text() == ""
    finally:
        fcntl.flock(holder, fcntl.LOCK_UN)  # a blocked writer (before the fix) goes on
        os.close(holder)
        pool.shutdown()


# --- the Router: load + record round trip ------------------------------------------------


def router(tmp_path: Path, **overrides: Any) -> Router:
    rc = RouterConfig(
        memory_home=str(tmp_path / "home"),
        memory_project_roots=(str(tmp_path / "projects"),),
        **overrides,
    )
    return Router(BridgeConfig(router=rc), None)


def request(wd: str, prompt: str = "convert the docx", mode: str = "auto") -> RoutingRequest:
    req = RoutingRequest.parse(
        {"taskPrompt": prompt, "workingDirectory": wd, "routing": {"routingMode": mode}}
    )
    assert req is not None
    return req


async def test_round_trip_project_local(tmp_path: Path) -> None:
    r = router(tmp_path)
    wd = tmp_path / "projects" / "app"
    wd.mkdir(parents=True)
    req = request(str(wd))
    decision = await r.resolve(req)
    assert await r.record(req, decision, {"success": True})
    text = (wd / ".xworkmate" / "memory.md").read_text()
    assert "preferred-route: single-agent\n" in text and "provider: codex\n" in text
    again = await r.resolve(request(str(wd), prompt="hello"))
    assert again.fields()["memorySources"] == [
        {"path": str(wd / ".xworkmate" / "memory.md"), "scope": "project-local"}
    ]


async def test_record_falls_back_to_home_projects(tmp_path: Path) -> None:
    r = router(tmp_path)
    wd = tmp_path / "not-allowed" / "svc"
    req = request(str(wd))
    decision = await r.resolve(req)
    assert await r.record(req, decision, {"success": "true"})
    assert (tmp_path / "home" / "self-improving" / "projects" / "svc.md").exists()
    assert not wd.exists()  # nothing created outside the roots


async def test_home_project_files_are_capped_in_number(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Every auto-routed turn whose working directory lies outside the project roots
    made ``<home>/self-improving/projects/<name>.md`` for the name the client gave: one
    new file per name, without bound. Past ``MAX_PROJECT_FILES`` no new one is made
    (the turn stands; logged); the files there already still take their blocks."""
    monkeypatch.setattr(memory_write, "MAX_PROJECT_FILES", 3)
    r = router(tmp_path)
    projects = tmp_path / "home" / "self-improving" / "projects"
    for name in ("a", "b", "c"):
        req = request(str(tmp_path / "elsewhere" / name))
        assert await r.record(req, await r.resolve(req), {"success": True})
    assert sorted(f.name for f in projects.iterdir()) == ["a.md", "b.md", "c.md"]
    req = request(str(tmp_path / "elsewhere" / "d"))
    assert not await r.record(req, await r.resolve(req), {"success": True})
    assert not (projects / "d.md").exists()
    assert "memory write failed" in caplog.text
    req = request(str(tmp_path / "elsewhere" / "b"))  # an existing one still records
    assert await r.record(req, await r.resolve(req), {"success": True})
    assert (projects / "b.md").read_text().count("## Auto route") == 2


@pytest.mark.parametrize(
    ("result", "mode", "prompt", "wd_ok"),
    [
        ({"success": False}, "auto", "convert the docx", True),
        ({}, "auto", "convert the docx", True),
        ({"success": True}, "explicit", "convert the docx", True),
        ({"success": True}, "auto", "search the web", True),  # gateway never records
        ({"success": True}, "auto", "convert the docx", False),  # blank wd
    ],
)
async def test_no_recording_when_conditions_fail(
    tmp_path: Path, result: dict[str, Any], mode: str, prompt: str, wd_ok: bool
) -> None:
    r = router(tmp_path)
    wd = tmp_path / "projects" / "app"
    routing: dict[str, Any] = {"routingMode": mode}
    if mode == "explicit":
        routing["explicitExecutionTarget"] = "singleAgent"
    req = RoutingRequest.parse(
        {"taskPrompt": prompt, "workingDirectory": str(wd) if wd_ok else "", "routing": routing}
    )
    assert req is not None
    decision = await r.resolve(req)
    assert not await r.record(req, decision, result)
    assert not (wd / ".xworkmate").exists()


async def test_write_failure_is_logged_not_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    r = router(tmp_path)
    wd = tmp_path / "projects" / "app"
    wd.mkdir(parents=True)
    (wd / ".xworkmate").write_text("a file where a directory should be")
    # and the home file's place taken too: nowhere to write
    (tmp_path / "home" / "self-improving").mkdir(parents=True)
    (tmp_path / "home" / "self-improving" / "projects").write_text("not a directory")
    req = request(str(wd))
    decision = await r.resolve(req)
    assert not await r.record(req, decision, {"success": True})
    assert "memory write failed" in caplog.text


@pytest.mark.parametrize("blocker", ["file", "symlink"])
async def test_an_xworkmate_that_cannot_be_made_falls_back_to_the_home_file(
    tmp_path: Path, blocker: str, caplog: pytest.LogCaptureFixture
) -> None:
    """routing.md §6.5: when ``<wd>/.xworkmate`` cannot be made the block goes to
    ``<home>/self-improving/projects/<project>.md``; it was logged and lost."""
    caplog.set_level(logging.INFO, logger="xwm_bridge.router")
    r = router(tmp_path)
    wd = tmp_path / "projects" / "app"
    wd.mkdir(parents=True)
    if blocker == "file":
        (wd / ".xworkmate").write_text("a file where a directory should be")
    else:  # not followed (nothing below the working directory is): refused, like a file
        (tmp_path / "elsewhere").mkdir()
        (wd / ".xworkmate").symlink_to(tmp_path / "elsewhere")
    req = request(str(wd))
    decision = await r.resolve(req)
    assert await r.record(req, decision, {"success": True})
    home = tmp_path / "home" / "self-improving" / "projects" / "app.md"
    assert "preferred-route: single-agent\n" in home.read_text()
    if blocker == "symlink":
        assert not list((tmp_path / "elsewhere").iterdir())
    assert "memory written to the home project file" in caplog.text
    # and the next turn reads it
    again = await r.resolve(request(str(wd), prompt="hello"))
    scopes = [s["scope"] for s in again.fields()["memorySources"]]
    assert "project-home" in scopes


async def test_memory_disabled_reads_and_writes_nothing(tmp_path: Path) -> None:
    r = router(tmp_path, memory_enabled=False)
    write(tmp_path / "home" / "self-improving" / "memory.md", "preferred-route: gateway\n")
    req = request(str(tmp_path / "projects" / "app"), prompt="hello")
    decision = await r.resolve(req)
    assert decision.execution_target == "single-agent"
    assert not await r.record(req, decision, {"success": True})


async def test_example_11_4_explicit_gateway_with_memory(tmp_path: Path) -> None:
    r = router(tmp_path)
    wd = tmp_path / "projects" / "repo"
    write(wd / ".xworkmate" / "memory.md", "preferred-model: gpt-5.4\n")
    req = RoutingRequest.parse(
        {
            "taskPrompt": "help me",
            "workingDirectory": str(wd),
            "routing": {
                "routingMode": "explicit",
                "explicitExecutionTarget": "gateway",
                "preferredGatewayProviderId": "OpenClaw",
            },
        }
    )
    assert req is not None
    fields = (await r.resolve(req)).fields()
    assert fields == {
        "resolvedExecutionTarget": "gateway",
        "resolvedProviderId": "",
        "resolvedGatewayProviderId": "openclaw",
        "resolvedModel": "gpt-5.4",
        "resolvedSkills": None,
        "skillResolutionSource": "none",
        "needsSkillInstall": False,
        "unavailable": False,
        "memorySources": [{"path": str(wd / ".xworkmate" / "memory.md"), "scope": "project-local"}],
    }


def test_home_default_is_env_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    locs = memory.locate("/a/b", "", ())
    assert locs.memory_dir == Path(os.path.realpath(tmp_path)) / "self-improving"
    monkeypatch.setenv("HOME", "relative")
    assert memory.locate("/a/b", "", ()).memory_dir is None
    assert asyncio.iscoroutinefunction(Router.record)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def tick(self) -> None:
        self.now += memory.STAT_TTL


async def test_reader_rereads_changed_files_only(tmp_path: Path) -> None:
    home = tmp_path / "home"
    path = home / "self-improving" / "memory.md"
    write(path, "preferred-route: gateway\n")
    clock = Clock()
    reader = memory.MemoryReader(4096, clock=clock)
    locs = memory.locate("", str(home), ())
    assert (await reader.load(locs)).route == "gateway"
    path.write_text("preferred-route: multi-agent, longer\n")  # new size → re-read
    clock.tick()
    assert (await reader.load(locs)).route == "multi-agent, longer"
    os.utime(path, ns=(1, 1))  # new mtime, same size → re-read
    path.write_text("preferred-route: single-agent, longer\n")
    os.utime(path, ns=(2, 2))
    clock.tick()
    assert (await reader.load(locs)).route == "single-agent, longer"
    path.unlink()
    clock.tick()
    prefs = await reader.load(locs)
    assert prefs.route == "" and prefs.sources == ()
    # a symlink in place of the file is not followed
    target = tmp_path / "elsewhere.md"
    target.write_text("preferred-route: gateway\n")
    path.symlink_to(target)
    clock.tick()
    assert (await reader.load(locs)).route == ""


async def test_the_reader_keeps_what_it_parsed_not_the_files_text(tmp_path: Path) -> None:
    """Each cached file kept its whole sanitized text (up to twice memory_max_bytes, 512
    KiB by default, in each of 1024 entries: 512 MiB), and parsed it again on every
    turn. Now it keeps the parsed preferences: a few strings per file."""
    import gc
    import tracemalloc

    reader = memory.MemoryReader(256 * 1024)
    prose = ("notes about the project, nothing to route by\n" * 5000)[: 200 * 1024]
    homes = []
    for i in range(12):
        home = tmp_path / f"home{i}"
        write(home / "self-improving" / "memory.md", prose + f"\npreferred-model: m{i}\n")
        homes.append(memory.locate("", str(home), ()))
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i, locs in enumerate(homes):
            assert (await reader.load(locs)).model == f"m{i}"
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held < 512 * 1024, held  # 12 files of 200 KiB: 2.4 MB held before
    # and what it kept still answers, without reading again
    assert (await reader.load(homes[3])).model == "m3"


async def test_a_file_past_the_read_cap_is_read_from_its_newest_lines(tmp_path: Path) -> None:
    """A memory file longer than the read cap (twice ``memory_max_bytes``: a file grown
    by hand, or by another writer) was read from its start: its oldest lines, so the
    preference recorded last, the one that wins, was not seen."""
    home = tmp_path / "home"
    filler = "".join(f"note {i}: nothing to route by\n" for i in range(200))
    text = "preferred-route: gateway\nprovider: old\n" + filler + "preferred-route: multi-agent\n"
    write(home / "self-improving" / "memory.md", text)
    assert len(text) > 2 * 1024
    prefs = await memory.MemoryReader(1024).load(memory.locate("", str(home), ()))
    assert prefs.route == "multi-agent"
    assert prefs.provider == ""  # only in the oldest lines, past the cap
    # the line the cap cuts is dropped, not read as a shorter one: here the cap starts
    # the read at "preferred-model: evil", the tail of the line "xxpreferred-model: evil"
    head, last = "xxpreferred-model: evil\n", "\npreferred-route: single-agent\n"
    cut = head + "z" * (2048 + 2 - len(head) - len(last)) + last
    assert len(cut) - 2048 == 2
    write(home / "self-improving" / "memory.md", cut)
    prefs = await memory.MemoryReader(1024).load(memory.locate("", str(home), ()))
    assert prefs.route == "single-agent" and prefs.model == ""


def _symlinked_xworkmate(tmp_path: Path) -> tuple[Path, Path]:
    """A project inside the roots whose ``.xworkmate`` points outside them (a cloned
    repository can ship that)."""
    root, outside = tmp_path / "projects", tmp_path / "outside"
    write(outside / "memory.md", "preferred-route: gateway\nprovider: evil\n")
    wd = root / "app"
    wd.mkdir(parents=True)
    (wd / ".xworkmate").symlink_to(outside)
    return root, wd


async def test_a_symlinked_xworkmate_is_not_followed(tmp_path: Path) -> None:
    """issue 16 item 7: only the last component was opened with O_NOFOLLOW."""
    root, wd = _symlinked_xworkmate(tmp_path)
    locs = memory.locate(str(wd), str(tmp_path / "home"), (str(root),))
    assert locs.project_local_dir == wd / ".xworkmate"  # the location itself is allowed
    prefs = memory.load(locs, 4096)
    assert (prefs.route, prefs.provider, prefs.sources) == ("", "", ())
    cached = await memory.MemoryReader(4096).load(locs)
    assert (cached.route, cached.provider, cached.sources) == ("", "", ())


def test_a_fifo_in_place_of_the_memory_file_is_not_read(tmp_path: Path) -> None:
    root = tmp_path / "projects"
    wd = root / "app"
    (wd / ".xworkmate").mkdir(parents=True)
    os.mkfifo(wd / ".xworkmate" / "memory.md")  # opening it for reading would block
    locs = memory.locate(str(wd), str(tmp_path / "home"), (str(root),))
    assert memory.load(locs, 4096).sources == ()


def test_a_real_xworkmate_directory_is_still_read(tmp_path: Path) -> None:
    root = tmp_path / "projects"
    wd = root / "app"
    write(wd / ".xworkmate" / "memory.md", "preferred-route: multi-agent\n")
    locs = memory.locate(str(wd), str(tmp_path / "home"), (str(root),))
    assert memory.load(locs, 4096).route == "multi-agent"


async def test_reader_trusts_a_stat_for_its_ttl(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Within the TTL a turn makes no filesystem call; after it, a change is seen."""
    home = tmp_path / "home"
    path = home / "self-improving" / "memory.md"
    write(path, "preferred-route: gateway\n")
    clock = Clock()
    reader = memory.MemoryReader(4096, clock=clock)
    locs = memory.locate("", str(home), ())
    assert (await reader.load(locs)).route == "gateway"
    calls: list[str] = []
    real_stat = memory._stat_beneath

    def counted(base: Path, parts: tuple[str, ...]) -> os.stat_result:
        calls.append(str(base.joinpath(*parts)))
        return real_stat(base, parts)

    monkeypatch.setattr(memory, "_stat_beneath", counted)
    path.write_text("preferred-route: multi-agent\n")
    clock.now += memory.STAT_TTL / 2
    assert (await reader.load(locs)).route == "gateway"  # cached: no stat, no read
    assert calls == []
    clock.now += memory.STAT_TTL / 2
    assert (await reader.load(locs)).route == "multi-agent"
    assert calls == [str(path)]
    reader.invalidate(str(path))  # the bridge wrote it: seen at once
    path.write_text("preferred-route: single-agent, x\n")
    assert (await reader.load(locs)).route == "single-agent, x"


def test_parse_dedupes_accumulated_skills() -> None:
    part = memory.parse("preferred-skills: PPTX, pdf\n## later\npreferred-skills: pptx, PDF, docx")
    assert part.skills == ["PPTX", "pdf", "docx"]


async def test_skills_from_memory_do_not_double_with_each_turn(tmp_path: Path) -> None:
    # a turn whose skills came from memory records them again: read back with every
    # earlier block's copies, the list doubled per turn (128 copies after 8 turns)
    r = router(tmp_path)
    wd = tmp_path / "projects" / "app"
    wd.mkdir(parents=True)
    skills = [{"id": "pptx", "label": "PPTX", "installed": True}]
    for prompt in ["make a powerpoint"] + ["hello"] * 6:
        req = RoutingRequest.parse(
            {
                "taskPrompt": prompt,
                "workingDirectory": str(wd),
                "routing": {"routingMode": "auto", "availableSkills": skills},
            }
        )
        assert req is not None
        decision = await r.resolve(req)
        assert decision.skills == ("PPTX",)
        assert await r.record(req, decision, {"success": True})
    assert (wd / ".xworkmate" / "memory.md").read_text().count("preferred-skills: PPTX\n") == 7


async def test_long_working_directories_are_not_held(tmp_path: Path) -> None:
    # the locations cache (1024 entries) and the reader's cache kept each client's
    # working directory and the paths made of it: 5x its size, a 4 MiB request body's
    # wd held 20 MiB, 1024 of them 20 GiB; no path past PATH_MAX can be opened anyway
    import gc
    import tracemalloc

    r = router(tmp_path)
    (tmp_path / "projects").mkdir()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(16):
            wd = f"{tmp_path / 'projects'}/{i:04d}" + "a" * (64 * 1024)
            decision = await r.resolve(request(wd, prompt="hello"))
            assert decision.memory_sources == ()
            del wd, decision
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held < 256 * 1024  # 5 MiB before the fix


def test_a_project_name_no_file_can_have_is_no_project() -> None:
    assert memory.project_name("/w/" + "a" * 252) == "a" * 252
    assert memory.project_name("/w/" + "a" * 253) == ""  # a253.md: 256 bytes
    assert memory.project_name("/w/" + "é" * 127) == ""  # 254 bytes + .md
    locs = memory.locate("/w/" + "x" * memory.MAX_PATH, "/home/u", ("/w",))
    assert (locs.project, locs.project_local_dir) == ("", None)


async def test_a_working_directory_is_resolved_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # realpath lstats each component of the client's path: on a hung NFS or automount
    # path it held the event loop (every session) until the mount answered
    r = router(tmp_path)
    wd = tmp_path / "elsewhere" / "app"
    loop_thread = threading.get_ident()
    callers: list[int] = []
    real = os.path.realpath

    def watched(path: Any, *args: Any, **kwargs: Any) -> Any:
        if str(path).startswith(str(wd)):
            callers.append(threading.get_ident())
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os.path, "realpath", watched)
    req = request(str(wd), prompt="hello")
    decision = await r.resolve(req)
    assert await r.record(req, decision, {"success": True})
    assert callers and loop_thread not in callers
    callers.clear()
    await r.resolve(request("", prompt="hello"))  # no client path: no thread needed
    assert callers == []


def test_writers_waiting_while_another_rotates_append_to_the_fresh_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two appends that opened memory.md before either had its lock: the first rotated
    it; the second, locked on the old (now ``.1``) file, rotated again, so the fresh
    file with the first's block became ``.1`` over the history, and nothing read either."""
    import fcntl

    path = tmp_path / "memory.md"
    path.write_text("HISTORY\n" + "x" * 86 + "\n")  # 95 bytes: each 7-byte block rotates
    holder = os.open(path, os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_EX)
    waiting = threading.Semaphore(0)
    real = memory_write.lock_until
    first = threading.local()

    def counted(fd: int, deadline: float, busy: str) -> None:
        if not getattr(first, "seen", False):
            first.seen = True
            waiting.release()  # this writer has its file open and waits for the lock
        real(fd, deadline, busy)

    monkeypatch.setattr(memory_write, "lock_until", counted)
    pool = ThreadPoolExecutor(2)
    futures = [pool.submit(memory_write.append, path, f"block{i}\n", 100) for i in range(2)]
    try:
        for _ in futures:
            assert waiting.acquire(timeout=10)
    finally:
        fcntl.flock(holder, fcntl.LOCK_UN)
        os.close(holder)
    for f in futures:
        f.result(timeout=10)
    pool.shutdown()
    assert sorted(path.read_text().splitlines()) == ["block0", "block1"]
    assert path.with_name("memory.md.1").read_text().startswith("HISTORY\n")


async def test_xworkmate_swapped_for_a_symlink_while_recording_is_not_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The append checked that ``.xworkmate`` was no symlink, then opened
    ``.xworkmate/memory.md`` by path: a writer in the working directory (its agent)
    swapping the directory for a symlink in between sent the block outside the roots."""
    r = router(tmp_path)
    wd = tmp_path / "projects" / "app"
    (wd / ".xworkmate").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    real = memory_write._open_regular

    def swapped(*args: Any) -> int:  # just before the file is opened
        if not (wd / ".xworkmate").is_symlink():
            (wd / ".xworkmate").rename(wd / "moved")
            (wd / ".xworkmate").symlink_to(outside)
        return real(*args)

    monkeypatch.setattr(memory_write, "_open_regular", swapped)
    req = request(str(wd))
    decision = await r.resolve(req)
    await r.record(req, decision, {"success": True})
    assert not (outside / "memory.md").exists()


def test_the_xworkmate_directory_is_made_0755(tmp_path: Path) -> None:
    # §6.5: mode 0755 whatever the umask (0 here: an open 0777 otherwise)
    wd = tmp_path / "projects" / "app"
    wd.mkdir(parents=True)
    old = os.umask(0)
    try:
        memory_write.append(
            wd / ".xworkmate" / "memory.md", "x\n", 1000, (wd, (".xworkmate", "memory.md"))
        )
    finally:
        os.umask(old)
    assert oct((wd / ".xworkmate").stat().st_mode & 0o777) == "0o755"
