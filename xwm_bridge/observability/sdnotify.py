"""systemd readiness (``Type=notify``): ``READY=1`` once listening, ``STOPPING=1`` on
the drain. The protocol is one datagram on the ``AF_UNIX`` socket named by
``$NOTIFY_SOCKET`` (a path, or ``@name`` in the abstract namespace); without it
every call is a no-op. The variable is taken out of the environment so that agents
started later do not inherit it (``NotifyAccess=main`` would ignore them anyway).
"""

from __future__ import annotations

import os
import socket
from collections.abc import MutableMapping

ENV = "NOTIFY_SOCKET"


class Notifier:
    def __init__(self, address: str) -> None:
        self.address = address

    @classmethod
    def from_env(cls, env: MutableMapping[str, str] | None = None) -> Notifier:
        environ = os.environ if env is None else env
        return cls(environ.pop(ENV, "").strip())

    @property
    def enabled(self) -> bool:
        return self.address.startswith(("/", "@"))

    def notify(self, *states: str) -> bool:
        """Send ``KEY=value`` lines; True when sent. Never raises: a service manager
        that went away must not take the daemon down with it."""
        if not self.enabled:
            return False
        target = "\0" + self.address[1:] if self.address.startswith("@") else self.address
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.connect(target)
                sock.sendall("\n".join(states).encode())
        except OSError:
            return False
        return True

    def ready(self, status: str) -> bool:
        return self.notify("READY=1", f"STATUS={status}", f"MAINPID={os.getpid()}")

    def stopping(self, status: str = "draining") -> bool:
        return self.notify("STOPPING=1", f"STATUS={status}")
