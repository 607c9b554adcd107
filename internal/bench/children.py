"""The benchmark's child processes: the fake upstream, the daemon and the load
generator, each started with a clean environment and stopped by its PID; the line
reader with a deadline that talks to them."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from internal.bench.report import ROOT

PY = sys.executable


class BenchError(Exception):
    pass


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- processes ---------------------------------------------------------------------------


class LineReader:
    """Reads lines from a child's pipe with a deadline (no thread, no blocking forever)."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._fd = stream.fileno()
        self._buf = b""

    def readline(self, timeout: float) -> bytes:
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BenchError("timed out waiting for a child process to answer")
            ready, _, _ = select.select([self._fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(self._fd, 65536)
            if not chunk:
                raise BenchError("child process closed its output")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line


@dataclass
class Service:
    name: str
    proc: subprocess.Popen[bytes]
    port: int = 0
    log_path: Path | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def rpc_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/acp/rpc"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/acp"


@dataclass
class Processes:
    """Every child this run started, so each is stopped by its PID at the end."""

    workdir: Path
    #: script run instead of ``-m xwm_bridge`` (A/B experiments); None = the package
    bridge_launcher: str | None = None
    started: list[Service] = field(default_factory=list)

    def env(self, **extra: str) -> dict[str, str]:
        prefixes = ("ACP_", "XWM_", "INTERNAL_SERVICE", "BRIDGE_", "IMAGE")
        env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
        env["PYTHONPATH"] = str(ROOT)
        env["PYTHONUNBUFFERED"] = "1"
        env.update(extra)
        return env

    def _spawn(self, name: str, args: list[str], env: dict[str, str], **kw: Any) -> Service:
        log_path = self.workdir / f"{name}-{len(self.started)}.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                args, cwd=ROOT, env=env, stderr=log, start_new_session=True, **kw
            )
        svc = Service(name, proc, log_path=log_path)
        self.started.append(svc)
        return svc

    def start_fake(self, latency_ms: float, chunks: int) -> Service:
        args = [PY, "-m", "internal.peers.fake_acp", "--port", "0"]
        args += ["--latency-ms", str(latency_ms), "--chunks", str(chunks)]
        svc = self._spawn("fake", args, self.env(), stdout=subprocess.PIPE)
        assert svc.proc.stdout is not None
        line = LineReader(svc.proc.stdout).readline(20).decode()
        if not line.startswith("listening "):
            raise BenchError(f"fake upstream said {line!r}")
        svc.port = int(line.rsplit(":", 1)[1])
        return svc

    def start_bridge(
        self,
        upstream: Service,
        token: str,
        *,
        config: dict[str, Any] | None = None,
        log_level: str = "info",
    ) -> Service:
        # The port is read from the "listening" log line, which is info level; with a
        # quieter level the bench picks a free port itself and waits until it accepts.
        announced = log_level in ("debug", "info")
        port = 0 if announced else _free_port()
        entry = [self.bridge_launcher] if self.bridge_launcher else ["-m", "xwm_bridge"]
        args = [PY, *entry, "serve", "--listen", f"127.0.0.1:{port}"]
        args += ["--log-level", log_level]
        if config is not None:
            path = self.workdir / f"bridge-{len(self.started)}.yaml"
            path.write_text(json.dumps(config))  # JSON is YAML
            args += ["--config", str(path)]
        env = self.env(
            ACP_AUTH_TOKEN=token,
            XWM_PROVIDER_CODEX_URL=f"http://127.0.0.1:{upstream.port}",
            XWM_STATE_DIR=str(self.workdir / "state"),  # the session store of this run
        )
        svc = self._spawn("bridge", args, env, stdout=subprocess.DEVNULL)
        assert svc.log_path is not None
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if announced:
                for line in svc.log_path.read_text(errors="replace").splitlines():
                    if '"msg":"listening"' in line:
                        svc.port = int(json.loads(line)["port"])
                        return svc
            elif _accepts(port):
                svc.port = port
                return svc
            if svc.proc.poll() is not None:
                raise BenchError(f"bridge exited: {svc.log_path.read_text()[-2000:]}")
            time.sleep(0.05)
        raise BenchError("bridge did not start listening within 20 s")

    def start_loadgen(self) -> tuple[Service, LineReader]:
        args = [PY, "-m", "internal.bench.loadgen"]
        svc = self._spawn(
            "loadgen", args, self.env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        assert svc.proc.stdout is not None
        return svc, LineReader(svc.proc.stdout)

    def stop(self, svc: Service) -> None:
        proc = svc.proc
        if proc.poll() is None:
            if proc.stdin is not None:
                proc.stdin.close()
            proc.send_signal(signal.SIGTERM)  # by PID: Popen signals proc.pid only
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        for stream in (proc.stdout, proc.stdin):
            if stream is not None and not stream.closed:
                stream.close()
        if svc in self.started:
            self.started.remove(svc)

    def stop_all(self) -> None:
        for svc in reversed(list(self.started)):
            self.stop(svc)


class LoadGen:
    def __init__(self, procs: Processes, client: str) -> None:
        self.svc, self._reader = procs.start_loadgen()
        self.client = client

    def run(self, **cell: Any) -> dict[str, Any]:
        cell.setdefault("client", self.client)
        stdin = self.svc.proc.stdin
        assert stdin is not None
        stdin.write(json.dumps(cell).encode() + b"\n")
        stdin.flush()
        budget = cell.get("warmup", 1.0) + cell.get("duration", 4.0) + cell.get("grace", 10.0)
        if cell.get("count"):
            budget = cell.get("max_time", 240.0)
        answer: dict[str, Any] = json.loads(self._reader.readline(budget + 30))
        if "fatal" in answer:
            raise BenchError(f"load generator failed: {answer['fatal']}")
        return answer


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    except OSError:
        return False
    return True
