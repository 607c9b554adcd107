"""Artifact enrichment (forwarding.md §4.8, examples.md §3), confined to the configured
allowed roots (ARCHITECTURE.md §2: the original read any path, even the bridge's home)."""

from __future__ import annotations

import asyncio
import base64
import os
import time
from pathlib import Path
from typing import Any

import aiohttp

from tests.conftest import (
    TOKEN,
    FakeUpstream,
    ServeApp,
    StartBridge,
    base_env,
    provider_env,
    rpc,
    scripted_app,
    session_params,
)

REPORT = {
    "relativePath": "outputs/report.txt",
    "label": "report.txt",
    "contentType": "text/plain; charset=utf-8",
    "encoding": "utf8",
    "content": "artifact-body",
    "sizeBytes": 13,
}


def write(path: Path, data: bytes | str, mtime: float | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    path.write_bytes(data)
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


async def artifacts_for(
    http: aiohttp.ClientSession, url: str, sid: str, workdir: str | None
) -> list[dict[str, Any]]:
    extra = {"workingDirectory": workdir} if workdir is not None else {}
    reply = await asyncio.wait_for(
        rpc(http, url, "session.start", session_params(sid, "hi", **extra)), 10
    )
    result = reply["result"]
    assert result["success"] is True, result
    artifacts: list[dict[str, Any]] = result["artifacts"]
    return artifacts


async def test_no_allowed_roots_means_no_artifacts(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    workdir = tmp_path / "ws"
    write(workdir / "outputs" / "report.txt", "artifact-body")
    bridge = await start_bridge(env=provider_env(fake_upstream.url))
    assert await artifacts_for(http, bridge.rpc_url, "s1", str(workdir)) == []


async def test_files_inside_allowed_root_are_returned(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    root = tmp_path / "root"
    demo = root / "demo"
    write(demo / "outputs" / "report.txt", "artifact-body")
    bridge = await start_bridge(env=provider_env(fake_upstream.url, XWM_ALLOWED_ROOTS=str(root)))
    url = bridge.rpc_url
    assert await artifacts_for(http, url, "s-demo", str(demo)) == [REPORT]
    # the allowed root itself is a valid working directory too
    [artifact] = await artifacts_for(http, url, "s-root", str(root))
    assert artifact == {**REPORT, "relativePath": "demo/outputs/report.txt"}
    # a relative, "..", or missing working directory yields nothing
    assert await artifacts_for(http, url, "s-rel", "demo") == []
    assert await artifacts_for(http, url, "s-missing", str(root / "missing")) == []
    assert await artifacts_for(http, url, "s-none", None) == []


async def test_scan_rules_order_types_and_skips(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    root = tmp_path / "root"
    proj = root / "proj"
    outside = write(tmp_path / "outside" / "secret.txt", "top secret")
    now = time.time()
    write(proj / "notes.md", "# notes", mtime=now - 30)
    write(proj / "data.json", '{"a":1}', mtime=now - 20)
    write(proj / "blob.bin", b"\x00\x01\xff", mtime=now - 10)
    write(proj / ".hidden" / "seen.txt", "hidden dirs are entered", mtime=now - 40)
    for skipped in (".git", "node_modules", "build", ".dart_tool"):
        write(proj / skipped / "skip.txt", "no", mtime=now)
    write(proj / "big.txt", b"x" * (2 * 1024 * 1024 + 1), mtime=now)
    (proj / "link.txt").symlink_to(outside)  # a link out of the tree is not followed
    (proj / "linkdir").symlink_to(outside.parent, target_is_directory=True)
    os.mkfifo(proj / "pipe")  # must not block the turn
    bridge = await start_bridge(env=provider_env(fake_upstream.url, XWM_ALLOWED_ROOTS=str(root)))

    artifacts = await artifacts_for(http, bridge.rpc_url, "s-scan", str(proj))
    assert [a["relativePath"] for a in artifacts] == [
        "blob.bin",
        "data.json",
        "notes.md",
        ".hidden/seen.txt",
    ]
    by_path = {a["relativePath"]: a for a in artifacts}
    assert by_path["blob.bin"] == {
        "relativePath": "blob.bin",
        "label": "blob.bin",
        "contentType": "application/octet-stream",
        "encoding": "base64",
        "content": base64.b64encode(b"\x00\x01\xff").decode(),
        "sizeBytes": 3,
    }
    assert by_path["data.json"]["encoding"] == "utf8"  # by extension, though not text/*
    assert by_path["data.json"]["contentType"] == "application/json"
    assert by_path["data.json"]["content"] == '{"a":1}'
    assert by_path["notes.md"]["encoding"] == "utf8"
    assert by_path["notes.md"]["content"] == "# notes"
    assert by_path[".hidden/seen.txt"]["label"] == "seen.txt"
    assert all("top secret" not in a["content"] for a in artifacts)


async def test_at_most_24_newest_files(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    root = tmp_path / "root"
    now = time.time()
    for i in range(30):
        write(root / "many" / f"f{i:02d}.txt", f"file {i}", mtime=now - 100 + i)
    bridge = await start_bridge(env=provider_env(fake_upstream.url, XWM_ALLOWED_ROOTS=str(root)))
    artifacts = await artifacts_for(http, bridge.rpc_url, "s-many", str(root / "many"))
    assert [a["label"] for a in artifacts] == [f"f{i:02d}.txt" for i in range(29, 5, -1)]


async def test_directories_outside_allowed_roots_are_not_read(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    root = tmp_path / "root"
    root.mkdir()
    outside = tmp_path / "outside"
    write(outside / "secret.txt", "top secret")
    (root / "escape").symlink_to(outside, target_is_directory=True)
    home = root / "home"  # even a HOME inside the allowed root is never a fallback
    write(home / "dotfile.txt", "home file")
    env = provider_env(fake_upstream.url, XWM_ALLOWED_ROOTS=str(root), HOME=str(home))
    bridge = await start_bridge(env=env)
    url = bridge.rpc_url
    for i, workdir in enumerate(
        ["/etc", str(outside), str(root / ".." / "outside"), str(root / "escape")]
    ):
        assert await artifacts_for(http, url, f"s-out-{i}", workdir) == [], workdir

    # codex with a missing working directory: no fallback to the bridge's home
    missing = str(root / "missing")
    reply = await rpc(
        http, url, "session.start", session_params("s-home", "x", workingDirectory=missing)
    )
    result = reply["result"]
    assert result["artifacts"] == []
    assert result["effectiveWorkingDirectory"] != str(home)
    # the forwarded workingDirectory is unchanged
    assert fake_upstream.state.requests[-1]["params"]["workingDirectory"] == missing


async def test_upstream_working_directory_is_a_candidate_root_but_confined(
    start_bridge: StartBridge, serve_app: ServeApp, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    empty = root / "empty"
    empty.mkdir(parents=True)
    write(root / "upstream-dir" / "out.txt", "from upstream dir")
    write(tmp_path / "outside" / "secret.txt", "top secret")
    upstream_dirs = {
        "inside": str(root / "upstream-dir"),
        "outside": str(tmp_path / "outside"),
    }

    def reply(body: dict[str, Any]) -> dict[str, Any]:
        which = body["params"]["taskPrompt"]
        result = {"success": True, "output": "ok", "resolvedWorkingDirectory": upstream_dirs[which]}
        return {"jsonrpc": "2.0", "id": body["id"], "result": result}

    base = await serve_app(scripted_app(reply, []))
    env = base_env(ACP_AUTH_TOKEN=TOKEN, XWM_PROVIDER_CODEX_URL=base, XWM_ALLOWED_ROOTS=str(root))
    bridge = await start_bridge(env=env)

    async def run(prompt: str) -> list[dict[str, Any]]:
        params = session_params(f"s-{prompt}", prompt, workingDirectory=str(empty))
        result = (await rpc(http, bridge.rpc_url, "session.start", params))["result"]
        artifacts: list[dict[str, Any]] = result["artifacts"]
        return artifacts

    # the client directory is empty, so the upstream-named one (inside the root) wins
    [artifact] = await run("inside")
    assert artifact["relativePath"] == "out.txt"
    assert artifact["content"] == "from upstream dir"
    assert await run("outside") == []


async def test_upstream_artifacts_are_kept(
    start_bridge: StartBridge, serve_app: ServeApp, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    write(root / "local.txt", "local")
    upstream_artifacts = [{"relativePath": "remote.txt", "label": "remote.txt", "content": "r"}]

    def reply(body: dict[str, Any]) -> dict[str, Any]:
        result = {"success": True, "output": "ok", "artifacts": upstream_artifacts}
        return {"jsonrpc": "2.0", "id": body["id"], "result": result}

    base = await serve_app(scripted_app(reply, []))
    env = base_env(ACP_AUTH_TOKEN=TOKEN, XWM_PROVIDER_CODEX_URL=base, XWM_ALLOWED_ROOTS=str(root))
    bridge = await start_bridge(env=env)
    assert await artifacts_for(http, bridge.rpc_url, "s-up", str(root)) == upstream_artifacts
