"""``vault_kv`` against a server that is not Vault: its answers are tool errors."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import orjson
import pytest

from xwm_bridge.config import ToolbridgeConfig
from xwm_bridge.toolbridge.tools import ToolError
from xwm_bridge.toolbridge.vault import vault_kv

#: (status, content type, body) answered to every request
ANSWERS = {
    "read": (200, "text/html", b"<html>sign in</html>"),
    "list": (200, "application/json", b"[]"),
    "write": (201, "text/plain", b"created"),
    "bad-data": (200, "application/json", b'{"data": "not an object"}'),
    "no-content": (204, "application/json", b""),
}


@pytest.fixture
def not_vault() -> Iterator[tuple[str, dict[str, str]]]:
    """A plain HTTP server; the test names which answer it gives."""
    current = {"op": "read"}

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            status, kind, body = ANSWERS[current["op"]]
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_LIST = do_DELETE = _answer

        def log_message(self, *_args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", current
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.mark.parametrize(
    ("op", "why"),
    [
        ("read", "HTTP 200, text/html"),
        ("list", "the body is not a JSON object"),
        ("write", "HTTP 201, text/plain"),
    ],
)
async def test_an_answer_that_is_not_vaults_is_a_tool_error(
    not_vault: tuple[str, dict[str, str]], op: str, why: str
) -> None:
    """A 200 that is not JSON (a login page), a JSON array, a 201 with text: each was an
    AttributeError (``-32603 internal error`` and a traceback in the log), not a
    tool error the model can read."""
    url, current = not_vault
    current["op"] = op
    cfg = ToolbridgeConfig(vault_url=url, vault_token="t0ken", vault_timeout=5)
    args = {"operation": op, "path": "app", "data": {"k": "v"}}
    with pytest.raises(ToolError) as info:
        await vault_kv(cfg, args)
    assert str(info.value) == f"vault api error: unexpected response ({why})"


async def test_a_read_whose_data_is_not_an_object_is_a_tool_error(
    not_vault: tuple[str, dict[str, str]],
) -> None:
    url, current = not_vault
    current["op"] = "bad-data"
    cfg = ToolbridgeConfig(vault_url=url, vault_token="t0ken", vault_timeout=5)
    with pytest.raises(ToolError) as info:
        await vault_kv(cfg, {"operation": "read", "path": "app"})
    assert str(info.value) == "vault api error: unexpected response (data is not a JSON object)"


async def test_a_204_is_an_empty_answer(not_vault: tuple[str, dict[str, str]]) -> None:
    """No content is not an error: the write result just has no metadata."""
    url, current = not_vault
    current["op"] = "no-content"
    cfg = ToolbridgeConfig(vault_url=url, vault_token="t0ken", vault_timeout=5)
    text = await vault_kv(cfg, {"operation": "write", "path": "app", "data": {"k": "v"}})
    assert orjson.loads(text) == {
        "operation": "write",
        "mount": "secret",
        "path": "app",
        "data": {"k": "v"},
    }
