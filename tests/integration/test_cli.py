"""Command line and configuration errors of the real executable (contract.md §1, §14)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import aiohttp
import orjson
import pytest

from tests.conftest import AUTH, ROOT, StartBridge, base_env, log_entries

CONSOLE_SCRIPT = Path(sys.executable).with_name("xwm-bridge")


def run(
    *args: str, env: dict[str, str] | None = None, timeout: float = 20
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "xwm_bridge", *args],
        env=env if env is not None else base_env(),
        cwd=str(ROOT),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def write_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bridge.yaml"
    path.write_text(text)
    return path


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("command", ["serve", "acp-stdio"])
@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("limits: {max_queue_depth: abc}\n", "limits.max_queue_depth"),
        ("limits: {max_body_bytes: -5}\n", "limits.max_body_bytes"),
        ("multi_agent_enabled: maybe\n", "multi_agent_enabled"),
        ("no_such_key: 1\n", "no_such_key"),
        ("limits: {no_such_limit: 1}\n", "limits.no_such_limit"),
        ("providers: [{label: X}]\n", "providers[0].id: required key is missing"),
        ("listen: nonsense\n", "listen"),
        ("limits: 5\n", "limits"),
    ],
    ids=[
        "bad-int",
        "negative",
        "bad-bool",
        "unknown-key",
        "unknown-nested-key",
        "provider-without-id",
        "bad-listen",
        "not-a-mapping",
    ],
)
def test_bad_config_exits_2_with_one_line_naming_the_key(
    tmp_path: Path, command: str, text: str, key: str
) -> None:
    path = write_config(tmp_path, text)
    proc = run(command, "--config", str(path))
    assert_one_line_error(proc, key)


def test_bad_config_via_env_variable(tmp_path: Path) -> None:
    path = write_config(tmp_path, "limits: {max_queue_depth: abc}\n")
    proc = run("serve", env=base_env(XWM_BRIDGE_CONFIG=str(path)))
    assert_one_line_error(proc, "limits.max_queue_depth")


@pytest.mark.parametrize("command", ["serve", "acp-stdio"])
def test_missing_config_file_exits_2(tmp_path: Path, command: str) -> None:
    missing = tmp_path / "nope.yaml"
    proc = run(command, "--config", str(missing))
    assert_one_line_error(proc, str(missing))


def test_invalid_yaml_exits_2(tmp_path: Path) -> None:
    path = write_config(tmp_path, "limits: [unclosed\n")
    proc = run("serve", "--config", str(path))
    assert_one_line_error(proc, str(path))


def test_unset_interpolated_variable_exits_2(tmp_path: Path) -> None:
    path = write_config(tmp_path, "public_base_url: ${XWM_TEST_UNSET_VARIABLE}\n")
    proc = run("serve", "--config", str(path))
    assert_one_line_error(proc, "public_base_url", "XWM_TEST_UNSET_VARIABLE")


def test_serve_help_mentions_every_option() -> None:
    proc = run("serve", "--help")
    assert proc.returncode == 0, proc.stderr
    for option in ("--listen", "--allow-unauthenticated", "--config", "--log-level", "--help"):
        assert option in proc.stdout, option
    assert "ACP_AUTH_TOKEN" in proc.stdout


def test_acp_stdio_help_mentions_every_option() -> None:
    proc = run("acp-stdio", "--help")
    assert proc.returncode == 0, proc.stderr
    for option in ("--config", "--log-level", "--help"):
        assert option in proc.stdout, option


@pytest.mark.skipif(not CONSOLE_SCRIPT.exists(), reason="console script not installed")
def test_console_script_help_lists_commands() -> None:
    proc = subprocess.run(
        [str(CONSOLE_SCRIPT), "--help"],
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "serve" in proc.stdout
    assert "acp-stdio" in proc.stdout
    proc = subprocess.run(
        [str(CONSOLE_SCRIPT), "serve", "--help"],
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    assert proc.returncode == 0
    assert "--listen" in proc.stdout


def test_unknown_flag_exits_2() -> None:
    proc = run("serve", "--no-such-flag")
    assert proc.returncode == 2
    assert "no-such-flag" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_busy_port_exits_1() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        proc = run("serve", "--listen", f"127.0.0.1:{port}")
    assert proc.returncode == 1, proc.stderr
    assert "ACP server failed:" in proc.stderr
    assert "Traceback" not in proc.stderr
    # the last line (what a `journalctl -n1` or a supervisor shows) is the failure, not
    # the shutdown's "draining" log line, and it says what to look at
    last = proc.stderr.splitlines()[-1]
    assert last.startswith("ACP server failed: "), proc.stderr
    assert "address already in use" in last
    assert f"another process listens on 127.0.0.1:{port}" in last and "ss -ltnp" in last


def test_busy_port_of_the_adapter_says_gemini_adapter_failed() -> None:
    """adapters.md §1.1: the adapter's listen failure is ``gemini adapter failed: …``."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        env = base_env(GEMINI_ADAPTER_LISTEN_ADDR=f"127.0.0.1:{port}", GEMINI_ADAPTER_BIN="true")
        proc = run("agent-adapter", env=env)
    assert proc.returncode == 1, proc.stderr
    assert "gemini adapter failed:" in proc.stderr and "ACP server failed" not in proc.stderr
    assert "Traceback" not in proc.stderr


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.mark.parametrize("style", ["separate", "equals"])
async def test_go_style_single_dash_listen_flag(
    start_bridge: StartBridge, http: aiohttp.ClientSession, style: str
) -> None:
    port = free_port()
    addr = f"127.0.0.1:{port}"
    # start_bridge passes --listen 127.0.0.1:0 first; the later -listen wins
    args = ("-listen", addr) if style == "separate" else (f"-listen={addr}",)
    bridge = await start_bridge(*args)
    assert bridge.port == port
    async with http.post(
        bridge.rpc_url, data=b'{"jsonrpc":"2.0","id":1,"method":"acp.capabilities"}', headers=AUTH
    ) as resp:
        assert resp.status == 200
        assert orjson.loads(await resp.read())["id"] == 1


async def test_config_file_values_apply(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    config = {
        "public_base_url": "https://from-file.example.test",
        "providers": [{"id": "solo", "label": "Solo", "endpoint": "http://127.0.0.1:9/acp/rpc"}],
    }
    bridge = await start_bridge(config=config, tmp=tmp_path)
    async with http.get(bridge.url + "/bridge/bootstrap/health") as resp:
        assert orjson.loads(await resp.read())["bridgeOrigin"] == "https://from-file.example.test"
    async with http.post(
        bridge.rpc_url, data=b'{"jsonrpc":"2.0","id":1,"method":"acp.capabilities"}', headers=AUTH
    ) as resp:
        result = orjson.loads(await resp.read())["result"]
    assert result["providerCatalog"] == [{"providerId": "solo", "label": "Solo"}]


async def test_env_overrides_config_file(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    env = base_env(ACP_AUTH_TOKEN="tok", BRIDGE_PUBLIC_BASE_URL="https://from-env.example.test")
    bridge = await start_bridge(
        env=env, config={"public_base_url": "https://from-file.example.test"}, tmp=tmp_path
    )
    async with http.get(bridge.url + "/bridge/bootstrap/health") as resp:
        assert orjson.loads(await resp.read())["bridgeOrigin"] == "https://from-env.example.test"


async def test_flag_overrides_config_file(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    port = free_port()
    # the file says one port, the (last) --listen flag another: the flag wins
    bridge = await start_bridge(
        "--listen", f"127.0.0.1:{port}", config={"listen": "127.0.0.1:1"}, tmp=tmp_path
    )
    assert bridge.port == port


# --- issue 15 item 11: help that is true --------------------------------------------------


def test_help_lists_every_method_and_route() -> None:
    from xwm_bridge.adapters.agent_adapter import ADAPTER_PATHS, AdapterMethods, AdapterSettings
    from xwm_bridge.app.bridge import Bridge
    from xwm_bridge.app.methods import BridgeMethods
    from xwm_bridge.config import BridgeConfig
    from xwm_bridge.transport.http import SERVE_PATHS

    methods = BridgeMethods(Bridge(BridgeConfig(store=BridgeConfig().store.__class__("memory"))))
    top = run("--help")
    serve = run("serve", "--help")
    assert top.returncode == serve.returncode == 0
    for method in methods.table():
        assert method in top.stdout, method
        assert method in serve.stdout, method
    for path in SERVE_PATHS:
        assert path in serve.stdout, path
    # the environment the daemon reads for its own safety and its outbound calls
    for name in ("ACP_AUTH_TOKEN", "XWM_ALLOWED_HOSTS", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY"):
        assert name in serve.stdout, name
    adapter = run("agent-adapter", "--help")
    for path in ADAPTER_PATHS:
        assert path in adapter.stdout, path
    settings = AdapterSettings()
    adapter_cfg = settings.bridge_config(
        BridgeConfig(store=BridgeConfig().store.__class__("memory"))
    )
    for method in AdapterMethods(Bridge(adapter_cfg), settings).table():
        assert method in adapter.stdout, method
    for option in ("--log-format", "--log-level"):
        for command in ("serve", "acp-stdio", "acp", "toolbridge", "agent-adapter"):
            assert option in run(command, "--help").stdout, (command, option)
    doctor = run("doctor", "--help")
    assert "--offline" in doctor.stdout


async def test_api_ping_reports_the_package_version(
    start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    from importlib.metadata import version

    from xwm_bridge import __version__

    assert __version__ == version("xwm-bridge")  # one version, from the package metadata
    bridge = await start_bridge(env=base_env(IMAGE="registry.example.com/xwm:1.2.3"))
    async with http.get(f"{bridge.url}/api/ping") as resp:
        body = await resp.json()
    assert body["packageVersion"] == __version__
    assert body["version"] == "1.2.3"  # the original's field, from IMAGE, unchanged


def test_no_arguments_runs_the_toolbridge_and_says_so() -> None:
    proc = run()  # stdin is /dev/null: the toolbridge ends at once
    assert proc.returncode == 0, proc.stderr
    first = proc.stderr.splitlines()[0]
    assert first.startswith("xwm-bridge: no command given; running the MCP toolbridge")
    assert "--help" in first
    assert proc.stdout == ""


def test_shell_completion_script() -> None:
    proc = run(env=base_env(_XWM_BRIDGE_COMPLETE="bash_source"))
    assert proc.returncode == 0, proc.stderr
    assert "_XWM_BRIDGE_COMPLETE" in proc.stdout and "complete " in proc.stdout
    assert proc.stderr == ""  # no toolbridge notice, no toolbridge
    words = run(env=base_env(_XWM_BRIDGE_COMPLETE="bash_complete", COMP_WORDS="xwm-bridge s",
                             COMP_CWORD="1"))  # fmt: skip
    assert "serve" in words.stdout


def test_log_format_text_and_json_defaults(tmp_path: Path) -> None:
    """--log-format text: one human-readable line per record; JSON when stderr is a
    pipe and nothing is asked; text when it is a terminal."""
    import os
    import pty

    # an audit line (the fast events path) and "draining" at the end (stdlib logging)
    mcp_init = b'{"jsonrpc":"2.0","id":1,"method":"acp.capabilities"}\n'

    def toolbridge(*args: str, tty: bool = False) -> str:
        env = base_env(XWM_LOG_LEVEL="debug", XWM_SESSION_STORE="memory")
        if not tty:
            proc = subprocess.run(
                [sys.executable, "-m", "xwm_bridge", "acp-stdio", *args],
                env=env, cwd=str(ROOT), input=mcp_init, capture_output=True, timeout=20,
            )  # fmt: skip
            return proc.stderr.decode()
        leader, follower = pty.openpty()
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "xwm_bridge", "acp-stdio", *args],
                env=env, cwd=str(ROOT), input=mcp_init, stdout=subprocess.PIPE,
                stderr=follower, timeout=20,
            )  # fmt: skip
            os.close(follower)
            follower = -1
            out = b""
            while True:
                try:
                    chunk = os.read(leader, 65536)
                except OSError:
                    break
                if not chunk:
                    break
                out += chunk
            return out.decode()
        finally:
            os.close(leader)
            if follower >= 0:
                os.close(follower)

    piped = [line for line in toolbridge().splitlines() if line]
    assert piped and all(orjson.loads(line)["ts"] for line in piped)
    assert {orjson.loads(line)["msg"] for line in piped} >= {"request", "draining"}
    text = [line for line in toolbridge("--log-format", "text").splitlines() if line]
    assert text and not any(line.startswith("{") for line in text)
    audit = next(line for line in text if " request " in line)
    assert " INFO " in audit and "xwm_bridge.dispatch" in audit
    assert "method=acp.capabilities" in audit and "transport=stdio" in audit
    assert any("draining" in line for line in text), text
    tty = [line for line in toolbridge(tty=True).splitlines() if line]
    assert tty and not any(line.startswith("{") for line in tty), tty
    forced = [line for line in toolbridge("--log-format", "json", tty=True).splitlines() if line]
    assert forced and all(line.startswith("{") for line in forced), forced


@pytest.mark.parametrize("how", ["flag", "env", "file"])
def test_acp_honours_log_format(tmp_path: Path, how: str) -> None:
    """`xwm-bridge acp` wrote JSON whatever log_format said."""
    env = base_env(XWM_SESSION_STORE="memory")
    args: list[str] = []
    if how == "flag":
        args = ["--log-format", "text"]
    elif how == "env":
        env["XWM_LOG_FORMAT"] = "text"
    else:
        args = ["--config", str(write_config(tmp_path, "log_format: text\n"))]
    proc = run("acp", *args, env=env)  # stdin is /dev/null: ends at once, logs "draining"
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line]
    assert lines, proc.stderr
    assert not any(line.startswith("{") for line in lines), lines
    assert any("draining" in line for line in lines), lines


@pytest.mark.parametrize("command", ["acp-stdio", "acp"])
async def test_a_stdio_mode_on_a_held_state_dir_exits_2_and_names_the_holder(
    tmp_path: Path, command: str
) -> None:
    """The store's reason (who holds it, what to do) on stderr, exit 2, no traceback."""
    from xwm_bridge.store.sqlite import SQLiteStore

    state = tmp_path / "state"  # XWM_STATE_DIR is kept as it is, by `acp` too
    holder = SQLiteStore(state / "sessions.db")
    await holder.start()
    try:
        proc = run(command, env=base_env(XWM_STATE_DIR=str(state)))
    finally:
        await holder.close()
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    said = [line for line in proc.stderr.splitlines() if line.startswith("xwm-bridge:")]
    assert len(said) == 1 and f"(pid {os.getpid()})" in said[0], proc.stderr


@pytest.mark.parametrize(
    ("token", "warned"), [("dev", True), ("x" * 15, True), ("0123456789abcdef", False)]
)
async def test_a_short_bearer_token_is_warned_about(
    start_bridge: StartBridge, token: str, warned: bool
) -> None:
    """Every configured secret is masked wherever it appears in the logs, so
    ACP_AUTH_TOKEN=x turned 'xwm_bridge' into '[REDACTED]wm_bridge' in every line,
    without a word why; the start now says so (and that the token is guessable)."""
    bridge = await start_bridge(env=base_env(ACP_AUTH_TOKEN=token))
    await bridge.stop()
    lines = [e for e in log_entries(bridge.logs) if e.get("msg") == "short bearer token"]
    assert bool(lines) is warned, bridge.logs
    if warned:
        assert lines[0]["level"] == "warning"
        assert lines[0]["which"] == ["auth_token"] and "16" in lines[0]["hint"]


@pytest.mark.parametrize("mode", ["serve", "agent-adapter"])
async def test_a_configured_agent_that_is_not_found_is_a_warning_at_start(
    start_bridge: StartBridge, tmp_path: Path, mode: str
) -> None:
    """The adapter's one agent (or a configured kind: stdio provider) missing from PATH
    was said only inside the info line 'local agents'; every turn then failed with
    'command not found'. The start now warns, naming the provider and the command."""
    if mode == "serve":
        config = {"providers": [{"id": "mine", "kind": "stdio", "command": ["no-such-xyz"]}]}
        bridge = await start_bridge(config=config, tmp=tmp_path)
        provider = "mine"
    else:
        from tests.integration.agent_helpers import start_adapter

        env = base_env(GEMINI_ADAPTER_BIN="no-such-xyz")
        bridge = await start_adapter(["agent-adapter"], env, None, tmp_path)
        provider = "gemini"
    await bridge.stop()
    warned = [e for e in log_entries(bridge.logs) if e.get("msg") == "configured agent not found"]
    assert len(warned) == 1, bridge.logs
    assert warned[0]["level"] == "warning" and warned[0]["provider"] == provider
    assert "no-such-xyz" in warned[0]["reason"]
