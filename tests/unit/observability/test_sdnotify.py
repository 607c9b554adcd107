"""sd_notify readiness for ``Type=notify`` units (issue 15 item 12)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from xwm_bridge.observability.sdnotify import Notifier


def test_ready_and_stopping_reach_a_path_socket(tmp_path: Path) -> None:
    path = str(tmp_path / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind(path)
        env = {"NOTIFY_SOCKET": path, "OTHER": "x"}
        notifier = Notifier.from_env(env)
        assert env == {"OTHER": "x"}  # children do not inherit it
        assert notifier.ready("listening on 127.0.0.1:1") is True
        got = server.recv(4096).decode().split("\n")
        assert got == ["READY=1", "STATUS=listening on 127.0.0.1:1", f"MAINPID={os.getpid()}"]
        assert notifier.stopping() is True
        assert server.recv(4096) == b"STOPPING=1\nSTATUS=draining"


def test_abstract_socket_and_no_socket() -> None:
    name = f"xwm-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind("\0" + name)
        assert Notifier("@" + name).ready("ok") is True
        assert server.recv(4096).startswith(b"READY=1\n")
    assert Notifier.from_env({}).ready("ok") is False
    assert Notifier("relative/path").ready("ok") is False
    assert Notifier("/nonexistent/notify.sock").ready("ok") is False  # never raises
