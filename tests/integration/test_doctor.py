"""``xwm-bridge doctor`` tells the truth (issue 15 item 8): stdio agents answer
``initialize``, configured components that fail make it exit non-zero,
unconfigured ones are left out, the session store is checked, ``--offline``
checks the config only; ``serve`` warns when no provider is enabled."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import orjson
import yaml

from tests.conftest import (
    ROOT,
    FakeUpstream,
    StartBridge,
    base_env,
    closed_port,
)
from tests.integration.agent_helpers import FAKE_AGENT


async def run_doctor(tmp: Path, path: Path, *args: str, **env: str) -> tuple[int, bytes, bytes]:
    """``xwm-bridge doctor --config path …``: exit code, stdout, stderr."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "xwm_bridge",
        "doctor",
        "--config",
        str(path),
        *args,
        env=base_env(**{"XWM_STATE_DIR": str(tmp / "state"), **env}),
        cwd=str(ROOT),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out, err


async def doctor(
    tmp: Path, config: dict[str, Any], *args: str, **env: str
) -> tuple[int, dict[str, Any]]:
    path = tmp / "doctor.yaml"
    path.write_text(yaml.safe_dump(config))
    code, out, err = await run_doctor(tmp, path, "--json", *args, **env)
    assert out, err
    return code, orjson.loads(out)


def by(doc: dict[str, Any], check: str) -> dict[str, dict[str, Any]]:
    return {c.get("provider", c["check"]): c for c in doc["checks"] if c["check"] == check}


async def test_stdio_agents_must_answer_initialize(tmp_path: Path) -> None:
    config = {
        "providers": [
            {"id": "good", "kind": "stdio", "command": FAKE_AGENT},
            {"id": "not-acp", "kind": "stdio", "command": [sys.executable, "-V"]},
            {
                "id": "silent",
                "kind": "stdio",
                "command": [sys.executable, "-c", "import time; time.sleep(60)"],
            },
            {"id": "missing", "kind": "stdio", "command": ["no-such-agent-xyz", "acp"]},
        ],
        "agents": {"initialize_timeout": 2},
    }
    code, doc = await doctor(tmp_path, config)
    checks = by(doc, "provider")
    assert code == 1
    assert checks["good"]["ok"] is True
    assert "initialize" in checks["good"]["detail"]
    assert checks["not-acp"]["ok"] is False and "exit status 0" in checks["not-acp"]["error"]
    assert checks["silent"]["ok"] is False and "within 2s" in checks["silent"]["error"]
    assert checks["missing"]["ok"] is False
    assert "no-such-agent-xyz" in checks["missing"]["error"]


async def test_an_agent_that_cannot_start_is_reported_for_what_is_wrong(tmp_path: Path) -> None:
    """A command file without the execute bit was "agent command not found" (the
    operator looks for a missing file), a cwd that is not there "command not found:
    <python>" (the chdir's ENOENT)."""
    plain = tmp_path / "agent.sh"
    plain.write_text("#!/bin/sh\n")
    config = {
        "providers": [
            {"id": "no-x", "kind": "stdio", "command": [str(plain), "acp"]},
            {"id": "no-cwd", "kind": "stdio", "command": FAKE_AGENT, "cwd": str(tmp_path / "gone")},
        ],
    }
    code, doc = await doctor(tmp_path, config)
    checks = by(doc, "provider")
    assert code == 1
    assert checks["no-x"]["error"] == f"agent command not executable: {plain}"
    gone = f"cannot start agent no-cwd: working directory not found: {tmp_path / 'gone'}"
    assert checks["no-cwd"]["error"] == gone


async def test_only_configured_components_are_checked_and_failures_exit_1(
    tmp_path: Path, fake_upstream: FakeUpstream
) -> None:
    providers = {"providers": [{"id": "codex", "endpoint": fake_upstream.url}]}
    code, doc = await doctor(tmp_path, providers)
    assert code == 0, doc
    assert by(doc, "gateway") == {}  # nobody configured an OpenClaw gateway
    down = f"ws://127.0.0.1:{closed_port()}"
    code, doc = await doctor(tmp_path, {**providers, "openclaw_url": down})
    assert code == 1
    assert by(doc, "gateway")["openclaw"]["ok"] is False


async def test_a_malformed_openclaw_url_is_a_config_error_not_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "doctor.yaml"
    for bad in ("ws://127.0.0.1:99999", "ws://[::1", "ws://user:hunter2@[::1"):
        path.write_text(yaml.safe_dump({"openclaw_url": bad}))
        code, out, err = await run_doctor(tmp_path, path)
        assert code == 2, (bad, out, err)
        assert b"config error: openclaw_url" in err and b"Traceback" not in err, err
        assert b"hunter2" not in err + out


async def test_a_stdio_provider_without_command_is_a_warning(
    tmp_path: Path, fake_upstream: FakeUpstream
) -> None:
    config = {
        "providers": [
            {"id": "codex", "endpoint": fake_upstream.url},
            {"id": "agent", "kind": "stdio"},
        ]
    }
    code, doc = await doctor(tmp_path, config)
    row = by(doc, "provider")["agent"]
    assert row["ok"] is True and row["warning"] == "kind: stdio without a command: never used"
    assert code == 0


async def test_the_session_store_is_checked(tmp_path: Path, fake_upstream: FakeUpstream) -> None:
    providers = [{"id": "codex", "endpoint": fake_upstream.url}]
    code, doc = await doctor(tmp_path, {"providers": providers})
    store = by(doc, "store")["store"]
    assert code == 0 and store["ok"] is True and "sqlite" in store["detail"]
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the state directory should be")
    bad = {"providers": providers, "store": {"state_dir": str(blocker)}}
    code, doc = await doctor(tmp_path, bad, XWM_STATE_DIR="")  # the env would win
    assert code == 1
    assert by(doc, "store")["store"]["ok"] is False
    redis = {
        "providers": providers,
        "store": {"backend": "redis", "redis_url": f"redis://127.0.0.1:{closed_port()}/0"},
    }
    code, doc = await doctor(tmp_path, redis)
    assert code == 1
    assert "cannot reach Redis" in by(doc, "store")["store"]["error"]


async def test_the_permission_rules_file_is_read(tmp_path: Path) -> None:
    """A missing or malformed agents.permission_rules_file passed doctor: the bridge
    then ran without its rules (every tool call asks)."""
    rules = tmp_path / "rules.yaml"
    config = {"providers": [], "agents": {"permission_rules_file": str(rules)}}
    code, doc = await doctor(tmp_path, config, "--offline")
    row = by(doc, "permissions")["permission_rules_file"]
    assert code == 1 and row["ok"] is False
    assert row["error"] == f"cannot read {rules}: No such file or directory"
    rules.write_text("- {action: maybe}\n")
    code, doc = await doctor(tmp_path, config, "--offline")
    row = by(doc, "permissions")["permission_rules_file"]
    assert code == 1 and row["error"] == f"{rules}[0].action: must be one of allow, reject, ask"
    rules.write_text("- {action: reject, kind: delete}\n- {action: allow, kind: read}\n")
    code, doc = await doctor(tmp_path, config, "--offline")
    row = by(doc, "permissions")["permission_rules_file"]
    assert code == 0 and row == {
        "check": "permissions",
        "provider": "permission_rules_file",
        "ok": True,
        "detail": f"{rules}: 2 rule(s)",
    }


async def test_the_text_names_a_section_key_set_from_the_environment(tmp_path: Path) -> None:
    """``store`` was shown ``[file]`` (or ``[default]``) while its state_dir came from
    XWM_STATE_DIR: the text said the opposite of the --json sources."""
    path = tmp_path / "doctor.yaml"
    path.write_text("store: {backend: sqlite}\n")
    code, out, err = await run_doctor(tmp_path, path, "--offline")  # sets XWM_STATE_DIR
    assert code == 0, err
    (store,) = [line for line in out.decode().splitlines() if line.startswith("  store = ")]
    assert store.endswith("  [file; state_dir: env:XWM_STATE_DIR]"), store
    (limits,) = [line for line in out.decode().splitlines() if line.startswith("  limits = ")]
    assert limits.endswith("  [default]"), limits


async def test_offline_validates_the_config_only(tmp_path: Path) -> None:
    down = f"http://127.0.0.1:{closed_port()}"
    config = {
        "providers": [
            {"id": "codex", "endpoint": down},
            {"id": "agent", "kind": "stdio", "command": ["no-such-agent-xyz"]},
        ],
        "openclaw_url": f"ws://127.0.0.1:{closed_port()}",
        "store": {"backend": "redis", "redis_url": f"redis://127.0.0.1:{closed_port()}/0"},
    }
    code, doc = await doctor(tmp_path, config, "--offline")
    assert code == 0, doc
    # the proxy row is what the environment says: no network either
    assert {c["check"] for c in doc["checks"]} == {"auth", "config", "proxy"}
    path = tmp_path / "bad.yaml"
    path.write_text("limits: {max_queue_depth: -1}\n")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "xwm_bridge", "doctor", "--offline", "--config", str(path),
        env=base_env(), cwd=str(ROOT),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2 and b"limits.max_queue_depth" in err


async def test_serve_warns_when_no_provider_is_enabled(
    start_bridge_process: StartBridge, tmp_path: Path
) -> None:
    config = {"providers": [{"id": "codex", "endpoint": "http://127.0.0.1:1", "enabled": False}]}
    bridge = await start_bridge_process(config=config, tmp=tmp_path)
    lines = [orjson.loads(x) for x in bridge.logs if x.startswith("{")]
    warning = next(e for e in lines if e["msg"] == "no provider is enabled")
    assert warning["level"] == "warning"
    assert "single-agent turns" in warning["hint"]


async def test_each_probe_says_which_deadline_ran_out(tmp_path: Path) -> None:
    """An HTTP provider that takes the connection and never answers fails with doctor's
    own 5 s, not "the configured deadline"; a silent agent with agents.probe_timeout
    (not agents.initialize_timeout, which stays 60 s here)."""
    accepted: list[asyncio.StreamWriter] = []

    async def hold(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)  # read nothing, answer nothing

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    config = {
        "providers": [
            {"id": "hang", "endpoint": f"http://127.0.0.1:{port}"},
            {"id": "silent", "kind": "stdio",
             "command": [sys.executable, "-c", "import time; time.sleep(60)"]},
        ],
        "agents": {"probe_timeout": 1, "initialize_timeout": 60},
    }  # fmt: skip
    try:
        code, doc = await doctor(tmp_path, config)
    finally:
        server.close()
        for writer in accepted:
            writer.close()
    rows = by(doc, "provider")
    assert code == 1
    assert rows["hang"]["ok"] is False and rows["hang"]["error"] == "no answer within 5s"
    assert rows["silent"]["ok"] is False and "within 1s" in rows["silent"]["error"]


async def test_the_effective_config_shows_the_agents_found_on_path(tmp_path: Path) -> None:
    """doctor checked the local opencode it found but printed, as the "effective"
    config, the remote opencode of the default catalog it replaces."""
    from tests.integration.test_local_agents import fake_agent_on_path

    script = fake_agent_on_path(tmp_path / "bin", "opencode")
    env = {"XWM_AGENTS_DETECT": "true", "XWM_AGENTS_PATH": str(tmp_path / "bin")}
    path = tmp_path / "empty.yaml"
    path.write_text("{}\n")
    code, out, err = await run_doctor(tmp_path, path, "--json", "--offline", **env)
    assert code == 0, err
    doc = orjson.loads(out)
    providers = doc["config"]["providers"]
    assert [p["id"] for p in providers] == ["opencode", "codex", "gemini"]
    assert providers[0]["kind"] == "stdio" and providers[0]["command"] == [str(script), "acp"]
    assert doc["sources"]["providers[0]"] == f"detected: {script}"
    code, out, err = await run_doctor(tmp_path, path, "--offline", **env)
    text = out.decode()
    assert "providers[0] = {'id': 'opencode', 'label': 'OpenCode (local)'" in text, text
    assert f"[detected: {script}]" in text
    assert "acp-server.svc.plus/opencode" not in text


async def test_a_failing_default_provider_says_it_is_the_built_in_catalog(
    tmp_path: Path,
) -> None:
    """With no config the remote codex/opencode/gemini of the production catalog are
    checked; one that fails named only acp-server.svc.plus, a host the operator never
    configured, and not how to be rid of it. (A proxy on a closed port makes them fail
    without a network.)"""
    path = tmp_path / "empty.yaml"
    path.write_text("{}\n")
    proxy = f"http://127.0.0.1:{closed_port()}"
    code, out, err = await run_doctor(tmp_path, path, "--json", HTTPS_PROXY=proxy)
    assert code == 1, err
    codex = by(orjson.loads(out), "provider")["codex"]
    assert codex["ok"] is False
    assert "built-in default catalog" in codex["hint"] and "providers:" in codex["hint"]
    assert all("hint" in r for r in by(orjson.loads(out), "provider").values())
    code, out, err = await run_doctor(tmp_path, path, HTTPS_PROXY=proxy)
    text = out.decode()
    # the three failing providers share one hint: printed once, naming them
    assert text.count("built-in default catalog") == 1, text
    line = next(x for x in text.splitlines() if "built-in default catalog" in x)
    assert line.startswith("  hint (codex, opencode, gemini): "), line
    assert "[FAIL] provider codex" in text
