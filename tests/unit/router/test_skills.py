"""Skill resolution (routing.md §4): every step, plus the finder/installer
commands run for real from scripted executables (enabled, argv from config,
no shell, deadline, output cap)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.conftest import wait_until
from tests.markers import both_loops
from tests.processes import ClosedStdin, alive
from xwm_bridge.config import BridgeConfig, RouterConfig
from xwm_bridge.router.resolver import RoutingRequest
from xwm_bridge.router.service import Router
from xwm_bridge.router.skills import (
    MAX_RUNNING_COMMANDS,
    InstallApproval,
    SkillCandidate,
    SkillCommands,
    candidate_keywords,
    install_request_id,
    parse_command_output,
    resolve_skills,
    static_find,
)


async def none_found(prompt: str) -> list[SkillCandidate]:
    return []


async def none_installed(approved: list[SkillCandidate]) -> list[SkillCandidate]:
    return []


def skills(
    prompt: str,
    explicit: tuple[str, ...] = (),
    available: list[SkillCandidate] | None = None,
    allow: bool = False,
    approval: InstallApproval | None = None,
    finder=none_found,  # type: ignore[no-untyped-def]
    installer=none_installed,  # type: ignore[no-untyped-def]
):  # type: ignore[no-untyped-def]
    return asyncio.run(
        resolve_skills(
            prompt,
            explicit,
            available or [],
            allow,
            approval or InstallApproval(),
            finder,
            installer,
        )
    )


def test_explicit_skills_win() -> None:
    r = skills("make slides", explicit=(" pdf ", "PDF", "", "docx"))
    assert (r.resolved, r.source, r.candidates) == (("pdf", "docx"), "local_match", ())


def test_local_match_uses_catalog_keywords() -> None:
    available = [SkillCandidate("pptx", "PPTX"), SkillCandidate("custom", "")]
    r = skills("build a powerpoint", available=available)
    assert (r.resolved, r.source) == (("PPTX",), "local_match")
    assert "powerpoint" in candidate_keywords(available[0])


def test_local_match_is_token_based() -> None:
    r = skills("an excellent idea", available=[SkillCandidate("xlsx", "Excel")])
    assert r.resolved == () and r.source == "none"


def test_static_finder_and_installed_match() -> None:
    assert [c.id for c in static_find("resize image and add subtitles")] == [
        "image-resizer",
        "video-translator",
    ]
    # the available skill's own keywords do not occur in the prompt (no local match),
    # but they contain a keyword of the found candidate → installed match
    r = skills("add subtitles", available=[SkillCandidate("vt-subtitles", "VT")])
    assert (r.resolved, r.source, r.needs_install) == (("VT",), "find_skills", False)
    assert [c.id for c in r.candidates] == ["video-translator"]


def test_install_request_id_is_sorted_and_normalized() -> None:
    ids = [SkillCandidate("B", ""), SkillCandidate("", "A"), SkillCandidate("b", "x")]
    assert install_request_id(ids) == "skill-install:a,b"
    assert install_request_id([]) == ""


def test_needs_install_without_approval() -> None:
    r = skills("add subtitles", allow=True)
    assert r.needs_install and r.install_request_id == "skill-install:video-translator"
    assert r.resolved == ()


def test_approved_install_runs_installer() -> None:
    calls: list[list[SkillCandidate]] = []

    async def installer(approved: list[SkillCandidate]) -> list[SkillCandidate]:
        calls.append(approved)
        return [SkillCandidate(c.id, c.label, c.description, True) for c in approved]

    approval = InstallApproval("skill-install:video-translator", ("Video-Translator",))
    r = skills("add subtitles", allow=True, approval=approval, installer=installer)
    assert [c.id for c in calls[0]] == ["video-translator"]
    assert (r.resolved, r.needs_install, r.install_request_id) == (
        ("video-translator",),
        False,
        "",
    )


@pytest.mark.parametrize(
    ("allow", "approval"),
    [
        (False, InstallApproval("skill-install:video-translator", ("video-translator",))),
        (True, InstallApproval("skill-install:other", ("video-translator",))),
        (True, InstallApproval("skill-install:video-translator", ())),
        (True, InstallApproval("skill-install:video-translator", ("pdf",))),
    ],
)
def test_install_not_approved(allow: bool, approval: InstallApproval) -> None:
    async def installer(approved: list[SkillCandidate]) -> list[SkillCandidate]:
        raise AssertionError("installer must not run")

    r = skills("add subtitles", allow=allow, approval=approval, installer=installer)
    assert r.needs_install and r.install_request_id == "skill-install:video-translator"


@pytest.mark.parametrize(
    ("stdout", "ids"),
    [
        (b'{"candidates":[{"id":"a"},{"id":"a"},{"label":"b","installed":"true"}]}', ["a", ""]),
        (b'[{"id":"a"}]', ["a"]),
        (b'{"skills":[{"id":"s","label":7}]}', ["s"]),
        (b'{"id":"one"}', ["one"]),
        (b'{"description":"no id"}', []),
        (b'{"candidates":[1]}', []),
        (b'{"candidates":"x"}', []),
        (b"not json", []),
        (b'"str"', []),
    ],
)
def test_parse_command_output(stdout: bytes, ids: list[str]) -> None:
    assert [c.id for c in parse_command_output(stdout)] == ids


# --- real commands ------------------------------------------------------------------------


def script(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text(f"#!{sys.executable}\nimport json, sys, time\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


FINDER = """
req = json.load(sys.stdin)
open(sys.argv[0] + ".seen", "w").write(json.dumps({"stdin": req, "argv": sys.argv[1:]}))
print(json.dumps({"candidates": [{"id": "video-translator", "label": "video-translator",
                                  "description": "translate video", "installed": False}]}))
"""
INSTALLER = """
req = json.load(sys.stdin)
open(sys.argv[0] + ".seen", "w").write(json.dumps(req))
print(json.dumps([dict(c, installed=True) for c in req["candidates"]]))
"""


def seen(executable: str) -> Any:
    """What a scripted command recorded, or None if it never ran."""
    path = Path(executable + ".seen")
    return json.loads(path.read_text()) if path.exists() else None


def commands(tmp_path: Path, find: str, install: str = "", enabled: bool = True) -> SkillCommands:
    return SkillCommands(
        enabled=enabled, find_bin=find, install_bin=install, timeout=2.0, max_output=4096
    )


@both_loops
async def test_finder_command_gets_prompt_on_stdin(tmp_path: Path) -> None:
    find = script(tmp_path, "finder", FINDER)
    found = await commands(tmp_path, find).find("  dub it  ")
    assert [c.description for c in found] == ["translate video"]
    assert seen(find) == {"stdin": {"prompt": "dub it"}, "argv": []}


async def test_commands_disabled_do_not_run(tmp_path: Path) -> None:
    find = script(tmp_path, "finder", FINDER)
    assert await commands(tmp_path, find, enabled=False).find("x") == []
    assert seen(find) is None


@both_loops
async def test_missing_or_failing_commands(tmp_path: Path) -> None:
    assert await commands(tmp_path, str(tmp_path / "nope")).find("x") == []
    assert await commands(tmp_path, "no-such-binary-xwm").find("x") == []
    failing = script(tmp_path, "fail", 'print(\'{"id":"a"}\'); sys.exit(3)')
    assert await commands(tmp_path, failing).find("x") == []
    big = script(tmp_path, "big", "print(json.dumps({'id': 'a' * 10000}))")
    assert await commands(tmp_path, big).find("x") == []


@both_loops
async def test_command_deadline_kills_process(tmp_path: Path) -> None:
    slow = script(tmp_path, "slow", "time.sleep(30)")
    cmds = SkillCommands(enabled=True, find_bin=slow, install_bin="", timeout=0.5, max_output=99)
    started = time.monotonic()
    assert await cmds.find("x") == []
    assert time.monotonic() - started < 5


@both_loops
async def test_approved_install_flow_example_11_3(tmp_path: Path) -> None:
    find = script(tmp_path, "finder", FINDER)
    install = script(tmp_path, "installer", INSTALLER)
    rc = RouterConfig(
        skill_commands_enabled=True,
        find_skills_bin=find,
        install_skill_bin=install,
        memory_home=str(tmp_path / "home"),
    )
    router = Router(BridgeConfig(router=rc), None)
    routing = {
        "routingMode": "auto",
        "allowSkillInstall": True,
        "availableSkills": [{"id": "docx", "label": "docx", "description": "docs"}],
    }
    params = {"taskPrompt": "translate and dub this video with subtitles", "routing": routing}
    first = await router.resolve(RoutingRequest.parse(params))  # type: ignore[arg-type]
    assert first.install_request_id == "skill-install:video-translator"
    assert first.needs_skill_install and seen(install) is None
    routing["installApproval"] = {
        "requestId": first.install_request_id,
        "approvedSkillKeys": ["video-translator"],
    }
    second = await router.resolve(RoutingRequest.parse(params))  # type: ignore[arg-type]
    assert seen(install) == {
        "candidates": [
            {
                "id": "video-translator",
                "label": "video-translator",
                "description": "translate video",
                "installed": False,
            }
        ]
    }
    fields = second.fields()
    assert fields["resolvedSkills"] == ["video-translator"]
    assert fields["needsSkillInstall"] is False
    assert "skillInstallRequestId" not in fields
    assert fields["skillCandidates"] == [
        {
            "id": "video-translator",
            "label": "video-translator",
            "description": "translate video",
            "installed": False,
        }
    ]
    assert os.environ.get("ACP_INSTALL_SKILL_BIN", "") != install  # argv came from config


@both_loops
async def test_skill_commands_run_without_the_bridges_secrets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACP_AUTH_TOKEN", "bridge-token-123456")
    monkeypatch.setenv("XWM_CLIENT_TOKENS", "client-a-123456,client-b-123456")
    monkeypatch.setenv("A_COPY", "client-b-123456")
    monkeypatch.setenv("HARMLESS", "kept")
    body = (
        "import os\n"
        "open(sys.argv[0] + '.seen', 'w').write(json.dumps(dict(os.environ)))\n"
        "print(json.dumps({'candidates': []}))"
    )
    find = script(tmp_path, "finder", body)
    assert await commands(tmp_path, find).find("x") == []
    child = seen(find)
    assert child["HARMLESS"] == "kept"
    assert not {"ACP_AUTH_TOKEN", "XWM_CLIENT_TOKENS", "A_COPY"} & set(child)


@both_loops
async def test_a_background_child_holding_stdout_neither_delays_nor_outlives_the_command(
    tmp_path: Path,
) -> None:
    """A finder that answers and exits, leaving a child with its stdout: the answer
    counts at once (not after the deadline), and the child is killed with the group."""
    pid_file = tmp_path / "child.pid"
    body = (
        "import subprocess\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "print(json.dumps({'id': 'video-translator', 'label': 'Video translator'}))\n"
    )
    finder = script(tmp_path, "forking", body)
    cmds = SkillCommands(enabled=True, find_bin=finder, install_bin="", timeout=10, max_output=4096)
    started = time.monotonic()
    found = await cmds.find("x")
    assert [c.id for c in found] == ["video-translator"]
    assert time.monotonic() - started < 5  # not the 10 s deadline
    child = int(pid_file.read_text())
    await wait_until(lambda: not alive(child))  # killed with the group


@both_loops
async def test_a_detached_child_holding_stdout_does_not_lose_the_answer(tmp_path: Path) -> None:
    """A finder that answers and exits, leaving a child in a session of its own with its
    stdout (the group kill does not reach it): the answer counts at once. It waited for
    the deadline and was reported as timed out, the answer lost."""
    pid_file = tmp_path / "child.pid"
    body = (
        "import subprocess\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],"
        " start_new_session=True)\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "print(json.dumps({'id': 'video-translator', 'label': 'Video translator'}))\n"
    )
    finder = script(tmp_path, "detaching", body)
    cmds = SkillCommands(enabled=True, find_bin=finder, install_bin="", timeout=10, max_output=4096)
    started = time.monotonic()
    try:
        found = await cmds.find("x")
        assert [c.id for c in found] == ["video-translator"]
        assert time.monotonic() - started < 5  # not the 10 s deadline
    finally:
        os.kill(int(pid_file.read_text()), signal.SIGKILL)  # out of any group we kill


def test_command_output_reads_installed_as_a_frame_bool() -> None:
    out = parse_command_output(
        b'[{"id":"a","installed":"yes"},{"id":"b","installed":"on"},{"id":"c","installed":1}]'
    )
    assert [(c.id, c.installed) for c in out] == [("a", True), ("b", False), ("c", True)]


@both_loops
async def test_at_most_four_skill_commands_run_at_once(tmp_path: Path) -> None:
    """Each routing preflight may start a finder: without a cap, a burst of requests
    started as many processes (the classifier has classifier_max_concurrency)."""
    body = (
        "import glob, os\n"
        "d = os.path.dirname(sys.argv[0])\n"
        "me = os.path.join(d, f'run-{os.getpid()}')\n"
        "open(me, 'w').close()\n"
        "running = len(glob.glob(os.path.join(d, 'run-*')))\n"
        "open(os.path.join(d, f'seen-{os.getpid()}'), 'w').write(str(running))\n"
        "time.sleep(0.4)\n"
        "os.remove(me)\n"
        "print(json.dumps({'id': 'video-translator'}))\n"
    )
    finder = script(tmp_path, "counting", body)
    cmds = SkillCommands(enabled=True, find_bin=finder, install_bin="", timeout=20, max_output=99)
    found = await asyncio.gather(*(cmds.find("x") for _ in range(8)))
    assert all([c.id for c in f] == ["video-translator"] for f in found)  # all served
    seen = _counts(tmp_path)
    assert len(seen) == 8 and max(seen) <= MAX_RUNNING_COMMANDS == 4


def _counts(directory: Path) -> list[int]:
    """How many commands each one saw running as it started."""
    return [int(p.read_text()) for p in directory.glob("seen-*")]


async def test_a_command_that_closed_its_stdin_still_gives_its_answer() -> None:
    """A finder that exits without reading its stdin, before the prompt is written: on
    uvloop the write raised RuntimeError (the closed pipe's transport), and the find
    failed with it instead of reading the answer the command printed."""
    stdout = asyncio.StreamReader()
    stdout.feed_data(b'{"candidates": []}\n')
    stdout.feed_eof()
    stdin = ClosedStdin()
    # a pid no process can have (above pid_max): whatever is signalled, nothing is
    proc = SimpleNamespace(stdin=stdin, stdout=stdout, pid=2**22 + 1, returncode=0)

    async def exited() -> None:
        return None

    watch = SimpleNamespace(wait_exit=exited)
    cmds = SkillCommands(enabled=True, find_bin="x", install_bin="", timeout=5, max_output=4096)
    out = await cmds._exchange(proc, watch, {"prompt": "x"})  # type: ignore[arg-type]
    assert out == b'{"candidates": []}\n' and stdin.closed


@both_loops
async def test_a_command_answering_before_it_reads_a_large_prompt(tmp_path: Path) -> None:
    """A finder that writes more than its pipe and the bridge's reader buffer hold
    before it reads its stdin, given a prompt larger than a pipe holds: the bridge
    wrote (and drained) the whole prompt before it read any output, each side waited
    on the other until the timeout, and the find found nothing."""
    body = """
sys.stdout.write(json.dumps({"candidates": [{"id": "big", "description": "d" * (1 << 20)}]}))
sys.stdout.flush()
req = json.load(sys.stdin)
"""
    eager = script(tmp_path, "eager", body)
    cmds = SkillCommands(
        enabled=True, find_bin=eager, install_bin="", timeout=10.0, max_output=4 << 20
    )
    found = await cmds.find("p" * (1 << 20))
    assert [c.id for c in found] == ["big"]
