"""``xwm-bridge client``: the console for people without a browser (issue 13).

Talks JSON-RPC over the bridge's WebSocket ``/acp`` with the same token and URL
config as the daemon (``--url``, else the config's ``listen``; ``ACP_AUTH_TOKEN``,
else the config's ``auth_token``, first ``admin_tokens`` entry, first ``client_tokens``
entry). The rendering below is pure (unit-tested);
:class:`Client` does the I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import re
import socket
import ssl
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO
from urllib.parse import urlsplit

import aiohttp
import orjson

from xwm_bridge import coerce
from xwm_bridge.proxy import ProxyEnvError, ProxySettings, aiohttp_session_options
from xwm_bridge.tasks import wait_for

CONNECT_TIMEOUT = 10.0
CALL_TIMEOUT = 30.0
#: seconds between pings; a bridge that does not answer one within half of it is gone
#: (a call without a deadline, a turn or bridge.watch, would wait forever on it)
HEARTBEAT = 20.0
SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"


class ClientError(Exception):
    """A failure to show the user in one line (exit status 1)."""


#: bidirectional controls: text shown in another order than it is (a file name that
#: reads ``x.png`` and is ``gnp.x``), as in source code (CVE-2021-42574)
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(c: str) -> str:
    if c in _NAMED:
        return _NAMED[c]
    code = ord(c)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def shown(value: Any) -> str:
    """A string from the bridge (an agent's tool call title, an option, a prompt, an
    error message) as one line of plain text: control characters (C0, DEL, C1: escape
    sequences that move the cursor, rewrite a line, set the terminal's title or
    clipboard), line breaks and bidirectional controls escaped as ``\\x1b``, ``\\n``,
    ``\\u202e``. Printed as they came, they rewrote the permission prompt the
    operator answers."""
    text = value if isinstance(value, str) else coerce.text(value)
    if text.isprintable() and text.isascii():
        return text  # the common case: nothing to escape
    return "".join(
        _escaped(c)
        if ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 or c in _BIDI or c in "\u2028\u2029"
        else c
        for c in text
    )


#: what JSON leaves raw and a terminal acts on: DEL, C1, bidirectional controls, the
#: line and paragraph separators (C0 controls are escaped by JSON itself)
_JSON_RAW = re.compile("[\x7f-\x9f\u2028\u2029" + "".join(sorted(_BIDI)) + "]")


def json_text(value: Any, *, indent: bool = False) -> str:
    """``--json`` output: the value as JSON, with what :data:`_JSON_RAW` matches written
    as ``\\uXXXX`` escapes (such a character can only be inside a string there, so the
    document parses to the same value; printed raw, it reorders or rewrites the line)."""
    text = orjson.dumps(value, option=orjson.OPT_INDENT_2 if indent else 0).decode()
    if text.isascii():
        return text  # the common case: nothing to escape
    return _JSON_RAW.sub(lambda m: f"\\u{ord(m[0]):04x}", text)


def shown_output(text: str) -> str:
    """A turn's output for a terminal: :func:`shown`, its line breaks and tabs kept (the
    permission prompt is on the same screen, and an escape sequence in the model's output
    moved the cursor up and rewrote it). Not a terminal: the output as it came."""
    if text.isprintable() and text.isascii():
        return text
    return "\n".join(
        "\t".join(shown(part) for part in line.split("\t")) for line in text.split("\n")
    )


def ws_url(base: str) -> str:
    """``http://host:port`` (or ``ws://…``, or ``host:port``) → ``ws://host:port/acp``."""
    text = base.strip()
    if "://" not in text:
        text = f"http://{text}"
    bad = ClientError(f"not a bridge URL: {base!r} (expected http://host:port)")
    try:
        parts = urlsplit(text)
        _ = parts.port  # a port that is not a number in 0-65535 raises too
    except ValueError:  # e.g. an unclosed [IPv6
        raise bad from None
    if parts.scheme not in ("http", "https", "ws", "wss") or not parts.hostname:
        raise bad
    scheme = "wss" if parts.scheme in ("https", "wss") else "ws"
    return f"{scheme}://{parts.netloc}/acp"


def unreachable(exc: BaseException) -> str:
    """Why a connection failed, in a few lowercase words: the OS's or the resolver's
    reason, not aiohttp's ``Cannot connect to host h:p ssl:default [...]``; a
    proxy's failure says so."""
    os_error = exc.os_error if isinstance(exc, aiohttp.ClientConnectorError) else exc
    if isinstance(os_error, ssl.SSLCertVerificationError):
        reason = f"TLS certificate not trusted: {os_error.verify_message}"
    elif isinstance(os_error, ssl.SSLError):  # its errno is OpenSSL's
        reason = f"TLS error: {os_error.reason or os_error.strerror}"
    elif isinstance(os_error, socket.gaierror) and os_error.strerror:
        reason = os_error.strerror  # its errno is the resolver's, not os.strerror's
    elif isinstance(os_error, OSError) and os_error.errno:
        reason = os.strerror(os_error.errno)
    else:
        reason = str(os_error) or type(os_error).__name__
    reason = reason[:1].lower() + reason[1:] if not reason.startswith("TLS") else reason
    if isinstance(exc, aiohttp.ClientProxyConnectionError):
        return f"the proxy {exc.host}:{exc.port}: {reason}"
    return reason


def listen_url(listen: str) -> str:
    host, _, port = listen.rpartition(":")
    if host in ("", "0.0.0.0", "::", "[::]"):
        host = "127.0.0.1"
    return f"http://{host}:{port}"


# --- pure rendering -------------------------------------------------------------------------


def ago(ts: float, now: float | None = None) -> str:
    if not ts:
        return "-"
    delta = (time.time() if now is None else now) - ts
    if delta < 60:
        return f"{max(0, int(delta))}s ago"
    if delta < 3600:
        return f"{int(delta // 60)}m ago"
    if delta < 86400:
        return f"{int(delta // 3600)}h ago"
    return f"{int(delta // 86400)}d ago"


def session_table(rows: list[dict[str, Any]], now: float | None = None) -> str:
    head = ("SESSION", "STATE", "PROVIDER", "UPDATED", "LAST PROMPT")
    lines = [head]
    for s in rows:
        last = s.get("lastTurn") or {}
        prompt = shown(coerce.text(last.get("prompt")).replace("\n", " "))
        lines.append(
            (
                shown(s.get("sessionId")),
                shown(s.get("state")),
                shown(s.get("provider")) or "-",
                ago(float(s.get("updatedAt") or 0), now),
                prompt[:60] + ("…" if len(prompt) > 60 else ""),
            )
        )
    widths = [max(len(r[i]) for r in lines) for i in range(len(head) - 1)]
    return "\n".join(
        "  ".join(col.ljust(w) for col, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1]
        for r in lines
    )


def event_line(e: dict[str, Any]) -> str | None:
    """One line per watched event (None: not worth a line); every string from the
    bridge :func:`shown`."""
    kind, type_ = e.get("kind"), e.get("type")
    sid = shown(e.get("sessionId"))
    stamp = time.strftime("%H:%M:%S", time.localtime(float(e.get("ts") or time.time())))
    if kind == "watch":
        return None
    if kind == "turn" and type_ == "update":
        u = e.get("update") or {}
        if u.get("type") == "delta":
            return f"{stamp} {sid} │ {shown(repr(u.get('delta')))}"
        if u.get("type") in ("tool_call", "tool_call_update"):
            what = shown(u.get("title") or u.get("toolCallId"))
            return f"{stamp} {sid} tool {what}: {shown(u.get('status'))}"
        return None
    if kind == "turn":
        extra = f" {e.get('status')}" if type_ == "finished" else f" {e.get('provider') or ''}"
        return f"{stamp} {sid} turn {shown(type_)}{shown(extra)} ({shown(e.get('turnId'))})"
    if kind == "permission":
        tc = e.get("toolCall") or {}
        what = shown(tc.get("title") or tc.get("kind") or "permission")
        rid = shown(e.get("requestId"))
        if type_ == "requested":
            opts = ", ".join(shown(o.get("optionId")) for o in e.get("options") or [])
            return f"{stamp} {sid} permission {rid} asks: {what} [{opts}]"
        by = e.get("answeredBy") or {}
        who = f" by {by.get('transport')} {by.get('address')}".rstrip() if by else ""
        return f"{stamp} {sid} permission {rid} {shown(e.get('outcome'))}{shown(who)}"
    if kind == "session":
        return f"{stamp} {sid} session {shown(type_)}"
    if kind in ("health", "queue"):
        return f"{stamp} {kind} {shown(type_)}"
    return None


@dataclass(slots=True)
class Progress:
    started: float = field(default_factory=time.monotonic)
    chars: int = 0
    tools: int = 0
    status: str = "running"
    ticks: itertools.count[int] = field(default_factory=itertools.count)

    def observe(self, update: dict[str, Any]) -> None:
        kind = update.get("type")
        if kind == "delta":
            delta = update.get("delta")
            self.chars += len(delta) if isinstance(delta, str) else 0
        elif kind == "tool_call":
            self.tools += 1
        elif kind == "permission" and update.get("pending"):
            self.status = "waiting for permission"
        elif kind == "permission":
            self.status = "running"

    def line(self, now: float | None = None) -> str:
        spin = SPINNER[next(self.ticks) % len(SPINNER)]
        elapsed = (time.monotonic() if now is None else now) - self.started
        return (
            f"{spin} {self.status} · {elapsed:.1f}s · {self.chars} chars · "
            f"{self.tools} tool call{'s' if self.tools != 1 else ''}"
        )


def permission_prompt(update: dict[str, Any]) -> str:
    tc = update.get("toolCall") or {}
    what = shown(tc.get("title") or tc.get("kind"))
    lines = [f"permission {shown(update.get('requestId'))}: {what}"]
    for i, opt in enumerate(update.get("options") or [], 1):
        name = shown(opt.get("name") or opt.get("optionId"))
        lines.append(f"  {i}) {name} [{shown(opt.get('kind'))}]")
    lines.append("choose (number or option id): ")
    return "\n".join(lines)


def choose(options: list[dict[str, Any]], answer: str) -> str | None:
    text = answer.strip()
    # ASCII digits, and few: "²" passes str.isdigit, which int() then refuses
    if text.isascii() and text.isdigit() and len(text) <= 6 and 1 <= int(text) <= len(options):
        return coerce.text(options[int(text) - 1].get("optionId"))
    for opt in options:
        if text and text == opt.get("optionId"):
            return text
    return None


# --- I/O --------------------------------------------------------------------------------------


class Client:
    def __init__(self, url: str, token: str) -> None:
        self.url = ws_url(url)
        self.token = token
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.on_notification: Callable[[dict[str, Any]], None] = lambda _m: None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._reader: asyncio.Task[None] | None = None
        self._http: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Client:
        # the proxies of this process's environment (xwm_bridge/proxy.py)
        try:
            proxies = ProxySettings.from_env(os.environ)
        except ProxyEnvError as exc:
            raise ClientError(str(exc)) from None
        self._http = aiohttp.ClientSession(**aiohttp_session_options(proxies))
        headers = {"Authorization": f"Bearer {self.token or 'anonymous'}"}
        try:
            self._ws = await wait_for(
                self._http.ws_connect(
                    self.url, headers=headers, timeout=aiohttp.ClientWSTimeout(ws_close=5),
                    max_msg_size=64 * 1024 * 1024, heartbeat=HEARTBEAT,
                ),
                CONNECT_TIMEOUT,
            )  # fmt: skip
        except TimeoutError:
            await self._http.close()
            raise ClientError(
                f"cannot reach the bridge at {self.url}: no answer within {CONNECT_TIMEOUT:g}s"
            ) from None
        except aiohttp.WSServerHandshakeError as exc:
            await self._http.close()
            if exc.status == 401:
                raise ClientError("the bridge refused the token (set ACP_AUTH_TOKEN)") from None
            raise ClientError(f"the bridge refused the connection: HTTP {exc.status}") from None
        except (aiohttp.ClientError, OSError) as exc:
            await self._http.close()
            raise ClientError(
                f"cannot reach the bridge at {self.url}: {unreachable(exc)}"
            ) from None
        self._reader = asyncio.get_running_loop().create_task(self._read(), name="client-reader")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader
        if self._ws is not None:
            await self._ws.close()
        if self._http is not None:
            await self._http.close()

    async def _read(self) -> None:
        assert self._ws is not None
        try:
            async for msg in self._ws:
                if msg.type != aiohttp.WSMsgType.TEXT:
                    break
                data = orjson.loads(msg.data)
                if "method" in data:
                    self.on_notification(data)
                    continue
                fut = self._waiting.pop(data.get("id"), None)
                if fut is not None and not fut.done():
                    fut.set_result(data)
        finally:
            for fut in self._waiting.values():
                if not fut.done():
                    fut.set_exception(ClientError("the bridge closed the connection"))

    async def call(
        self, method: str, params: dict[str, Any], wait_s: float | None = CALL_TIMEOUT
    ) -> dict[str, Any]:
        assert self._ws is not None
        if self._reader is None or self._reader.done():  # nothing would ever answer
            raise ClientError("the bridge closed the connection")
        rid = next(self._ids)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[rid] = fut
        body = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}
        try:
            await self._ws.send_str(orjson.dumps(body).decode())
        except (aiohttp.ClientError, OSError):
            self._waiting.pop(rid, None)
            raise ClientError("the bridge closed the connection") from None
        try:
            reply = await (wait_for(fut, wait_s) if wait_s else fut)
        except TimeoutError:  # a hung bridge (its pings still answered): one line, no traceback
            self._waiting.pop(rid, None)
            raise ClientError(
                f"{method}: no answer from the bridge at {self.url} within {wait_s:g}s"
            ) from None
        if "error" in reply:
            err = reply["error"]
            raise ClientError(f"{method}: {shown(err.get('message'))} ({shown(err.get('code'))})")
        result: dict[str, Any] = reply.get("result") or {}
        return result


async def run_turn(
    client: Client,
    params: dict[str, Any],
    out: TextIO,
    err: TextIO,
    read_line: Callable[[], Any],
) -> dict[str, Any]:
    """Stream one turn: output to ``out``, the progress line and permission prompts to
    ``err``; answers read with ``read_line()`` (an awaitable of one line)."""
    progress = Progress()
    tty = err.isatty()
    out_tty = out.isatty()
    asks: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    settled: set[str] = set()

    def show_progress() -> None:
        if tty:
            err.write("\r\x1b[2K" + progress.line())
            err.flush()

    def on_note(msg: dict[str, Any]) -> None:
        p = msg.get("params") or {}
        if msg.get("method") != "session.update" or p.get("sessionId") != params["sessionId"]:
            return
        progress.observe(p)
        if p.get("type") == "delta":
            if tty:
                err.write("\r\x1b[2K")
            raw = p.get("delta")
            delta = raw if isinstance(raw, str) else ""
            out.write(shown_output(delta) if out_tty else delta)
            out.flush()
        elif p.get("type") == "permission" and p.get("pending"):
            asks.put_nowait(p)
        elif p.get("type") == "permission" and p.get("requestId"):
            settled.add(coerce.text(p.get("requestId")))
        show_progress()

    client.on_notification = on_note

    async def answer_asks() -> None:
        while True:
            ask = await asks.get()
            rid = coerce.text(ask.get("requestId"))
            options = list(ask.get("options") or [])
            while rid not in settled:
                err.write(("\n" if tty else "") + permission_prompt(ask))
                err.flush()
                line = await read_line()
                if rid in settled:
                    err.write(f"permission {shown(rid)} was answered elsewhere\n")
                    break
                if not line:  # no more input: leave it to other clients or the deadline
                    return
                option = choose(options, line)
                if option is None:
                    err.write("not one of the options\n")
                    continue
                try:
                    await client.call(
                        "session.permission",
                        {"sessionId": params["sessionId"], "requestId": rid, "optionId": option},
                    )
                except ClientError as exc:
                    err.write(f"{exc}\n")  # shown() by call
                break

    async def tick() -> None:
        while True:
            await asyncio.sleep(0.2)
            show_progress()

    async with asyncio.TaskGroup() as group:
        helpers = [group.create_task(answer_asks()), group.create_task(tick())]
        try:
            result = await client.call("session.start", params, wait_s=None)
        finally:
            for task in helpers:
                task.cancel()
    if tty:
        err.write("\r\x1b[2K")
    status = "cancelled" if result.get("cancelled") else "ok" if result.get("success") else "failed"
    out.write("\n")
    err.write(f"turn {status} in {time.monotonic() - progress.started:.1f}s")
    if result.get("error"):
        err.write(f": {shown(result.get('error'))}")
    err.write("\n")
    return result


def stdin_lines() -> Callable[[], Any]:
    """Lines of stdin without blocking the loop (a daemon thread reads)."""
    from xwm_bridge.transport.stdio import stdin_reader

    read = stdin_reader(sys.stdin.fileno())
    buffer = bytearray()

    async def read_line() -> str:
        while b"\n" not in buffer:
            chunk = await read()
            if not chunk:
                tail = buffer.decode(errors="replace")
                buffer.clear()
                return tail
            buffer.extend(chunk)
        head, _, rest = bytes(buffer).partition(b"\n")
        buffer[:] = rest
        return head.decode(errors="replace") + "\n"

    return read_line
