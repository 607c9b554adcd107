"""The decoder fuzz against the real daemon (issue 16): hypothesis-made frames, nesting
past orjson's limits and sizes up to the caps, on HTTP, WebSocket, acp-stdio, the
toolbridge and the ACP front door (``xwm-bridge acp``). Every input gets a result or a
JSON-RPC error on the transport it came on, and the process stays up."""

from __future__ import annotations

import http.client
import queue
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

from tests.conftest import ROOT, TOKEN, base_env, closed_port
from tests.fuzz_inputs import request_text

CAP = 64 * 1024
WAIT = 15.0
DAEMON = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
frames = st.integers(1, 10**6).flatmap(lambda n: request_text(n, CAP))


class Lines:
    """A child's stdout, line by line, read on a thread (so every wait has a deadline)."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self._lines: queue.Queue[bytes] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(b"")

    def next(self) -> bytes:
        line = self._lines.get(timeout=WAIT)
        assert line, f"the daemon closed its output (exit {self.proc.poll()})"
        return line


def _config(tmp: Path) -> Path:
    down = f"http://127.0.0.1:{closed_port()}"
    doc = {
        "limits": {"max_body_bytes": CAP, "max_ws_message_bytes": CAP},
        "providers": [{"id": "codex", "endpoint": down}, {"id": "gemini", "endpoint": down}],
        "log_level": "warning",
    }
    path = tmp / "fuzz.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _spawn(mode: str, tmp: Path, *args: str) -> subprocess.Popen[bytes]:
    env = base_env(ACP_AUTH_TOKEN=TOKEN, LLM_BASE_URL=f"http://127.0.0.1:{closed_port()}/v1")
    env["LLM_API_KEY"] = "fuzz-key"
    return subprocess.Popen(
        [sys.executable, "-m", "xwm_bridge", mode, "--config", str(_config(tmp)), *args],
        env=env,
        cwd=str(ROOT),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=(tmp / f"{mode}.stderr").open("wb"),
    )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)


@pytest.fixture(scope="module")
def serve(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    tmp = tmp_path_factory.mktemp("fuzz-serve")
    port = closed_port()
    proc = _spawn("serve", tmp, "--listen", f"127.0.0.1:{port}")
    try:
        for _ in range(200):  # up within 20 s
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
                conn.request("GET", "/livez")
                if conn.getresponse().status == 200:
                    break
            except OSError:
                threading.Event().wait(0.1)
        else:
            raise AssertionError((tmp / "serve.stderr").read_text())
        yield proc, port
    finally:
        _stop(proc)


def _is_answer(doc: Any) -> bool:
    return isinstance(doc, dict) and "method" not in doc and ("result" in doc or "error" in doc)


@given(frame=frames)
@DAEMON
def test_http_bodies(serve: tuple[subprocess.Popen[bytes], int], frame: bytes) -> None:
    proc, port = serve
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT)
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    conn.request("POST", "/acp/rpc", body=frame, headers=headers)
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    assert resp.status in (200, 400, 413), (resp.status, body[:300])
    assert _is_answer(orjson.loads(body)), body[:300]
    assert proc.poll() is None


@given(frame=frames)
@DAEMON
def test_websocket_messages(serve: tuple[subprocess.Popen[bytes], int], frame: bytes) -> None:
    proc, port = serve
    text = frame.decode("utf-8", "replace")
    with ws_connect(
        f"ws://127.0.0.1:{port}/acp",
        additional_headers={"Authorization": f"Bearer {TOKEN}"},
        max_size=None,
        open_timeout=WAIT,
    ) as ws:
        ws.send(text)
        try:
            while True:
                doc = orjson.loads(ws.recv(timeout=WAIT))
                if _is_answer(doc):
                    break
        except ConnectionClosed as exc:  # only a message over the cap closes the socket
            assert exc.rcvd is not None and exc.rcvd.code == 1009
            assert len(text.encode()) > CAP
    assert proc.poll() is None


def _stdio_case(mode: str) -> Any:
    @pytest.fixture(scope="module")
    def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lines]:
        proc = _spawn(mode, tmp_path_factory.mktemp(f"fuzz-{mode}"))
        try:
            yield Lines(proc)
        finally:
            _stop(proc)

    return running


acp_stdio = _stdio_case("acp-stdio")
toolbridge = _stdio_case("toolbridge")
acp_agent = _stdio_case("acp")  # the ACP front door (issue 12)


def _exchange(lines: Lines, frame: bytes, framed: bool) -> None:
    stdin = lines.proc.stdin
    assert stdin is not None
    if framed:
        stdin.write(b"Content-Length: %d\r\n\r\n" % len(frame) + frame)
    else:
        stdin.write(frame.replace(b"\n", b" ") + b"\n")
    stdin.flush()
    while not _is_answer(orjson.loads(lines.next())):
        pass  # session.update notifications before the answer
    assert lines.proc.poll() is None


@given(frame=frames, framed=st.booleans())
@DAEMON
def test_acp_stdio_frames(acp_stdio: Lines, frame: bytes, framed: bool) -> None:
    _exchange(acp_stdio, frame, framed)


@given(frame=frames, framed=st.booleans())
@DAEMON
def test_toolbridge_frames(toolbridge: Lines, frame: bytes, framed: bool) -> None:
    _exchange(toolbridge, frame, framed)


@given(frame=frames, framed=st.booleans())
@DAEMON
def test_acp_front_door_frames(acp_agent: Lines, frame: bytes, framed: bool) -> None:
    _exchange(acp_agent, frame, framed)
