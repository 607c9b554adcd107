"""The listening socket's protocol: ``POST /acp/rpc`` answered here, the rest by aiohttp.

aiohttp's ``web`` layer costs about 0.03 ms of CPU per request on the target
machine, as much as everything the bridge does for a cheap method
(performance.md). The hot route gets a protocol-level HTTP/1.1 server instead,
on the same ``httptools`` parser as the upstream client (``providers/http1.py``):

* a connection whose **first** request is an HTTP/1.1 ``POST /acp/rpc`` with no
  ``Upgrade`` or ``Expect`` header, a ``Host`` and no :data:`SINGLETONS` field twice
  (aiohttp refuses those heads with 400) stays here: its requests are parsed by
  :class:`FrontProtocol` and answered through ``front_server.Endpoint.answer`` (the same
  method logic as aiohttp's route, ``HttpTransport.answer``);
* any other connection is **handed over** once its first request head is
  complete: an aiohttp request handler gets the bytes received so far and,
  from then on, every event of the connection. A request this server cannot
  take that arrives later on a connection it kept (another route on a
  kept-alive connection) is handed over the same way when it starts a read;
  one pipelined behind another request in the same read cannot be, and is
  answered ``Connection: close`` after the requests before it (RFC 9112 §9.3.2
  lets the client retry it on a new connection).

Every connection, kept or handed over, goes through the
:class:`~xwm_bridge.transport.guard.ConnectionGuard` (per-address cap, first
header deadline, send deadline: this protocol reports its write pauses). Kept
connections have the same limits as aiohttp's: body size (413 and close) and
body deadline (400 and close), the keep-alive idle timeout, a client that goes
away cancels its request. ``front_server.Front.install``
ties them to aiohttp's server shutdown, so ``AppRunner.cleanup`` closes idle
ones first and waits for the others, as it does for its own.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
from typing import TYPE_CHECKING, cast

import httptools
from aiohttp.tcp_helpers import tcp_nodelay

from xwm_bridge.codings import announced, transfer_refusal
from xwm_bridge.observability import rejections as rj
from xwm_bridge.transport.exchange import Reply
from xwm_bridge.transport.front_answers import MAX_PIPELINED, MAX_PIPELINED_BYTES, Answers
from xwm_bridge.transport.front_wire import FIELD_KEYS, SINGLETONS, Headers, Request, field_key

# lookups by lower-case name, without Headers' own lowering
_has = dict.__contains__
_get = dict.get

if TYPE_CHECKING:
    from xwm_bridge.transport.front_server import Front

RPC_PATH = b"/acp/rpc"
#: a request head larger than this is handed to aiohttp (which refuses it with its
#: own 400) or, on a connection already answered here, refused with 431 and closed
MAX_HEAD_BYTES = 64 * 1024
#: aiohttp's own limits (its parser's defaults): field lines, bytes of the request
#: target and of one field's name or value; a head over them is handed to aiohttp,
#: whose 400 it gets (or, pipelined, refused here)
MAX_HEADERS = 128
MAX_LINE = 8190
MAX_FIELD = 8190


class Reading(enum.Enum):
    """Where the parser is in the current request."""

    IDLE = "idle"  # between requests
    HEAD = "head"  # a request head has begun
    BODY = "body"  # its head is in; its body is arriving
    STOPPED = "stopped"  # nothing more is read here (handed over, refused or closing)


class _Stop(Exception):
    """Raised in a parser callback: stop parsing this read."""


class FrontProtocol(Answers, asyncio.Protocol):
    """One client connection (see the module docstring)."""

    def __init__(self, front: Front) -> None:
        self.front = front
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.reading = Reading.IDLE
        #: the aiohttp handler this connection was handed to
        self.delegate: asyncio.Protocol | None = None
        self.remote = ""
        self.lost = False
        self.close_after = False  # finish the queued answers, then close
        #: what this read holds: the bytes of a head that may still be handed over
        self._data = b""
        self._fresh = True  # no request head completed yet
        self._raw: list[bytes] | None = None
        self._head_bytes = 0
        self._head_read = 0
        self._lines = 0
        self._body_read = 0  # bytes of the later reads of this body
        self._completed_in_read = False
        self._url: list[bytes] = []
        self._headers = Headers()
        #: a singleton field came twice (never reset: such a head ends the reading)
        self._repeated = False
        self._request: Request | None = None
        self._body_size = 0
        self.queue: collections.deque[Request] = collections.deque()
        self._queued_bytes = 0
        self.task: asyncio.Task[None] | None = None
        self.paused = False
        self._drained: asyncio.Future[None] | None = None
        self._reading_paused = False
        self._idle_since = 0.0
        self._idle_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None

    # --- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        self.transport = transport
        if not self.front.guard.opened(self, transport):
            self.lost = True
            self.reading = Reading.STOPPED
            return
        peer = transport.get_extra_info("peername")
        self.remote = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        tcp_nodelay(transport, True)  # SSE chunks leave at once, as aiohttp's do
        self.front.kept.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.delegate is not None:
            self.front.unfinished.pop(self.delegate, None)
            self.delegate.connection_lost(exc)
        self._gone()

    def data_received(self, data: bytes) -> None:
        if self.delegate is not None:
            self.delegate.data_received(data)
            return
        if self.reading is Reading.STOPPED:
            return
        self._data = data
        self._completed_in_read = False
        if self._raw is not None:
            self._raw.append(data)
        reading = self.reading
        if reading is Reading.HEAD:
            self._head_read += len(data)
        body_of = self._request if reading is Reading.BODY else None
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            if not isinstance(exc.__context__, _Stop):
                raise
        except httptools.HttpParserError:
            self._bad_request()
        self._data = b""
        if self.reading is Reading.HEAD and self._head_read > MAX_HEAD_BYTES:
            self._head_unfinished()
        if body_of is not None and body_of is self._request:
            self._body_continues(body_of, len(data))
        if self.reading is Reading.BODY and self._body_timer is None and not self._reading_paused:
            loop = asyncio.get_running_loop()
            self._body_timer = loop.call_later(self.front.body_timeout, self._body_late)

    def eof_received(self) -> bool | None:
        if self.delegate is not None:
            return self.delegate.eof_received()
        return None

    def pause_writing(self) -> None:
        if self.delegate is not None:
            self.delegate.pause_writing()
        self.paused = True
        self.front.guard.paused(self)  # the send deadline

    def resume_writing(self) -> None:
        if self.delegate is not None:
            self.delegate.resume_writing()
        self.paused = False
        self.front.guard.resumed(self)
        self._wake()

    # --- httptools callbacks ----------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.reading = Reading.HEAD
        self._url = []
        self._headers = Headers()
        self._head_read = 0  # bytes of the later reads of this head
        self._lines = 0  # field lines of this head, repeated names included
        self._head_bytes = 0
        # a head that begins a read can still be handed over: keep its bytes
        self._raw = None if self._completed_in_read else [self._data]

    # on_url and on_header run for every request: the head's byte count is inlined
    # (not a call to _count_head), and names are looked up as lower-case keys directly

    def on_url(self, url: bytes) -> None:
        self._url.append(url)
        self._head_bytes += len(url)
        if self._head_bytes > MAX_HEAD_BYTES:
            self._too_big()

    def on_header(self, name: bytes, value: bytes) -> None:
        size, n = len(value), len(name)
        self._head_bytes += n + size
        if self._head_bytes > MAX_HEAD_BYTES:
            self._too_big()
        if self.reading is Reading.BODY:
            return  # a chunked body's trailer: dropped, as aiohttp drops them
        # aiohttp's MAX_HEADERS counts field lines, a repeated name's too
        if self._lines >= MAX_HEADERS or size > MAX_FIELD or n > MAX_FIELD:
            self._too_big()
        self._lines += 1
        key = FIELD_KEYS.get(name) or field_key(name)
        headers = self._headers
        if not _has(headers, key):
            headers[key] = value.decode("utf-8", "surrogateescape")
        elif key in SINGLETONS:
            self._repeated = True

    def on_headers_complete(self) -> None:
        if self._fresh:  # the connection's first head: its header deadline ends
            self.front.guard.head(self)
        url = b"".join(self._url)
        path = url.partition(b"?")[0]
        headers = self._headers
        parser = self.parser
        if (
            path != RPC_PATH
            or parser.get_method() != b"POST"
            or parser.get_http_version() != "1.1"
            or parser.should_upgrade()
            or _has(headers, "expect")
            or not _has(headers, "host")  # aiohttp's 400 (RFC 9112 §3.2)
            or self._repeated
            or len(url) > MAX_LINE
        ):
            self._not_mine()
        assert self.transport is not None
        request = Request(headers, self.remote, self.transport)
        request.keep_alive = parser.should_keep_alive()
        endpoint = self.front.endpoint
        if _has(headers, "origin"):  # none without an Origin (Endpoint.cors)
            request.cors = endpoint.cors(request)
        self._raw = None  # answered here from now on
        self._fresh = False
        self._request = request
        self._body_size = 0
        self._body_read = 0
        self.reading = Reading.BODY
        coding = _get(headers, "transfer-encoding")
        refusal = 0 if coding is None else transfer_refusal(coding)
        if refusal:  # a coding before ``chunked``: 501, the body unread (aiohttp: http.py)
            self._refuse(request, endpoint.bad_request(request, rj.CODING, refusal))
        request.reply = endpoint.denied(request)
        if announced(_get(headers, "content-length")) > self.front.max_body:
            # refused unread, and a refusal already decided goes out at once
            self._refuse(request, request.reply or endpoint.body_too_large(request))

    def on_body(self, body: bytes) -> None:
        request = self._request
        assert request is not None
        self._body_size += len(body)
        if self._body_size > self.front.max_body:
            reply = request.reply or self.front.endpoint.body_too_large(request)
            self._refuse(request, reply)
        if request.reply is None:
            request.body.append(body)
            request.size += len(body)

    def on_message_complete(self) -> None:
        request = self._request
        assert request is not None
        self._request = None
        self._completed_in_read = True
        self.reading = Reading.IDLE
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        self._enqueue(request)

    # --- requests ---------------------------------------------------------------------------

    def _head_unfinished(self) -> None:
        """The reads since a head began (counted from its second read on) hold over
        :data:`MAX_HEAD_BYTES` and the head is still not complete: refused or handed
        over. httptools reports a field only once it is complete, so a field still
        arriving is bounded here. Decided after the read is parsed, not before: a read
        that completes the head also holds what follows it (its body, pipelined
        requests), which is not the head's (such a read of more than 64 KiB was refused
        with 431)."""
        with contextlib.suppress(_Stop):
            self._too_big()

    def _body_continues(self, request: Request, n: int) -> None:
        """A read that went on with a body begun earlier. Its bytes beyond the body's
        (chunk framing, a trailer: httptools reports a trailer field only once it is
        complete) are bounded by twice the body and 64 KiB, else 400 and close."""
        self._body_read += n
        if self._body_read <= 3 * self._body_size + MAX_HEAD_BYTES:
            return
        reply = request.reply or self.front.endpoint.bad_request(request, rj.BAD_REQUEST, 400)
        with contextlib.suppress(_Stop):
            self._refuse(request, reply)

    def _can_hand_over(self) -> bool:
        """The current head began a read and nothing is owed before it."""
        return self._raw is not None and self.task is None and not self.queue

    def _too_big(self) -> None:
        if self._can_hand_over():
            self._not_mine(head_done=False)  # aiohttp's, within its limits, or its 400
        self._refuse_head()

    def _not_mine(self, *, head_done: bool = True) -> None:
        """A request for aiohttp: hand the connection over, or (pipelined) close."""
        if self._can_hand_over():
            assert self._raw is not None
            self._handover(b"".join(self._raw), head_done=head_done)
        else:
            self.close_after = True  # after the answers before it (RFC 9112 §9.3.2)
            self.reading = Reading.STOPPED
            self._maybe_close()
        raise _Stop

    def _handover(self, data: bytes, *, head_done: bool) -> None:
        """``head_done`` False: aiohttp completes the first head, and tells the guard."""
        assert self.transport is not None
        self.reading = Reading.STOPPED
        self._raw = None
        self._cancel_timers()
        self.front.kept.discard(self)
        delegate = self.front.fallback()
        self.delegate = delegate
        if not head_done:
            self.front.unfinished[delegate] = self
        delegate.connection_made(self.transport)
        if self.paused:
            delegate.pause_writing()
        if self._reading_paused:
            self._reading_paused = False
            self.transport.resume_reading()
        delegate.data_received(data)

    def _refuse(self, request: Request, reply: Reply) -> None:
        """Answer ``reply`` once the requests before it are answered, then close."""
        request.reply = reply
        request.keep_alive = False
        self._request = None
        self.reading = Reading.STOPPED
        self._cancel_timers()
        self._enqueue(request)
        raise _Stop

    def _bare_request(self) -> Request:
        assert self.transport is not None
        return Request(Headers(), self.remote, self.transport)

    def _refuse_head(self) -> None:
        request = self._bare_request()
        self._refuse(request, self.front.endpoint.bad_request(request, rj.HEAD_TOO_LARGE, 431))

    def _bad_request(self) -> None:
        """The parser refused the bytes. In a head that began this read (or the first
        bytes of the connection) aiohttp answers them with its own 400; otherwise 400
        here, after the answers before it, and close."""
        if self._request is None and self.task is None and not self.queue:
            raw = self._raw if self._raw is not None else [self._data] if self._fresh else None
            if raw is not None:
                self._handover(b"".join(raw), head_done=False)
                return
        request = self._bare_request()
        reply = self.front.endpoint.bad_request(request, rj.BAD_REQUEST, 400)
        with contextlib.suppress(_Stop):
            self._refuse(request, reply)

    def _body_late(self) -> None:
        self._body_timer = None
        request = self._request
        if request is None or self.reading is not Reading.BODY:
            return
        reply = request.reply or self.front.endpoint.bad_body(request)
        with contextlib.suppress(_Stop):
            self._refuse(request, reply)

    def _enqueue(self, request: Request) -> None:
        self.queue.append(request)
        self._queued_bytes += request.size
        if self.task is None:
            loop = asyncio.get_running_loop()
            self.task = loop.create_task(self._answer_queued(), name="rpc-connection")
        elif (
            len(self.queue) >= MAX_PIPELINED or self._queued_bytes >= MAX_PIPELINED_BYTES
        ) and self.transport is not None:
            self._reading_paused = True
            self.transport.pause_reading()  # a body begun now is not timed until resumed

    def _reading_resumed(self) -> None:
        if self.reading is Reading.BODY and self._body_timer is None:
            loop = asyncio.get_running_loop()  # a body begun while paused: timed from now
            self._body_timer = loop.call_later(self.front.body_timeout, self._body_late)

    # --- timers and shutdown ----------------------------------------------------------------

    def _arm_idle(self) -> None:
        loop = asyncio.get_running_loop()
        self._idle_since = loop.time()
        if self._idle_timer is None and self.front.keepalive_timeout > 0:
            self._idle_timer = loop.call_at(
                self._idle_since + self.front.keepalive_timeout, self._idle_check
            )

    def _idle_check(self) -> None:
        """Close a connection idle (no request, or only part of a head) for longer than
        the keep-alive timeout since its last answer."""
        self._idle_timer = None
        if self.lost or self.task is not None or self.queue or self.reading is Reading.BODY:
            return  # busy: armed again after its next answer
        due = self._idle_since + self.front.keepalive_timeout
        loop = asyncio.get_running_loop()
        if loop.time() < due:
            self._idle_timer = loop.call_at(due, self._idle_check)
            return
        if self.transport is not None:
            self.transport.close()

    def _cancel_timers(self) -> None:
        for timer in (self._idle_timer, self._body_timer):
            if timer is not None:
                timer.cancel()
        self._idle_timer = self._body_timer = None

    def close_when_idle(self) -> None:
        self.close_after = True
        if self.reading is not Reading.BODY:
            self.reading = Reading.STOPPED
            self._maybe_close()

    def abort(self) -> None:
        if self.task is not None:
            self.task.cancel()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def _gone(self) -> None:
        self.lost = True
        self.reading = Reading.STOPPED
        self._cancel_timers()
        self.queue.clear()
        self._queued_bytes = 0
        self.front.kept.discard(self)
        self.front.guard.lost(self)
        if self.task is not None:
            self.task.cancel()  # the client went away: its request is abandoned
        self._wake()
