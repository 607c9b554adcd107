"""One JSON object per line on stderr (or, with ``--log-format text``, one
human-readable line), with every configured secret redacted.

Two ways in, one way out:

* :data:`events` — the per-request audit line and the per-turn line. Built as a
  dict and serialized with orjson straight away: no ``logging.LogRecord``, no
  handler lock, no formatter lookup (about 20 µs saved per request);
* the stdlib :mod:`logging` tree, for everything else, through :class:`JsonFormatter`.

Both render through :func:`render_line` (same fields, same redaction; JSON, or
``key=value`` text for a terminal) into one
:class:`LineSink`, which writes the lines in order, in batches, from its own
thread: the event loop never blocks on ``write(2)``. Warnings and errors are
written through at once (with everything queued before them), so a crash right
after loses at most ``flush_interval`` of info lines: the writer thread writes them
at once and the caller waits for that, at most :data:`WRITE_THROUGH_WAIT` (a stderr
that takes nothing, its reader stalled, must not stall the event loop with it).
"""

from __future__ import annotations

import atexit
import logging
import os
import time
from collections.abc import Callable, Iterable
from typing import Any

import orjson

from xwm_bridge.observability.context import request_id, turn_id
from xwm_bridge.observability.line_sink import WRITE_THROUGH_WAIT, LineSink
from xwm_bridge.observability.redact import MIN_SECRET_LEN, REDACTED, Redactor, add_secrets

__all__ = [
    "MIN_SECRET_LEN",
    "REDACTED",
    "EventLog",
    "JsonFormatter",
    "LineSink",
    "Redactor",
    "add_secrets",
    "setup_logging",
]

_STANDARD = frozenset(
    vars(logging.LogRecord("x", logging.INFO, "x", 0, "x", None, None)).keys()
) | {"message", "asctime", "taskName"}
#: longest string a log field keeps (a 3 MB ``sessionId`` must not make a 3 MB line)
MAX_FIELD_CHARS = 2048
#: longest traceback kept in ``exc``
MAX_EXC_CHARS = 16384
#: a line longer than this has its container fields shortened to a bounded repr
MAX_LINE_BYTES = 65536
LEVEL_NAMES = {
    logging.DEBUG: "debug",
    logging.INFO: "info",
    logging.WARNING: "warning",
    logging.ERROR: "error",
    logging.CRITICAL: "critical",
}


class _Clock:
    """ISO-8601 UTC timestamps with ms, ``strftime`` once per second."""

    def __init__(self) -> None:
        self._second = -1
        self._stamp = ""

    def stamp(self, now: float) -> str:
        second = int(now)
        if second != self._second:
            self._second = second
            self._stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return f"{self._stamp}.{int((now - second) * 1000):03d}Z"


def _cap(value: str, limit: int, redactor: Redactor | None = None) -> str:
    """``value`` cut to ``limit`` characters; redacted first (a secret across the cut
    would no longer be whole, and its first characters would stay in the line)."""
    if len(value) <= limit:
        return value
    if redactor:
        value = redactor.text(value)
        if len(value) <= limit:
            return value
    return f"{value[:limit]}…(+{len(value) - limit} chars)"


def _capped(fields: dict[str, Any], redactor: Redactor | None = None) -> dict[str, Any]:
    """Every string field cut to :data:`MAX_FIELD_CHARS` (values often come from clients
    and peers); containers stay, and are bounded by the line cap."""
    out = fields
    for key, value in fields.items():
        if isinstance(value, str) and len(value) > MAX_FIELD_CHARS:
            if out is fields:
                out = dict(fields)
            out[key] = _cap(value, MAX_FIELD_CHARS, redactor)
    return out


def _put_capped(
    entry: dict[str, Any], fields: dict[str, Any] | None, exc: str, redactor: Redactor
) -> None:
    if fields:
        entry.update(_capped(fields, redactor))
    if exc:
        entry["exc"] = exc


#: the integers orjson writes (a 64-bit signed or unsigned value)
_INT_RANGE = range(-(2**63), 2**64)


def _scalar(value: Any, redactor: Redactor | None = None) -> Any:
    if isinstance(value, (str, float, bool)) or (isinstance(value, int) and value in _INT_RANGE):
        return value
    # an int past 64 bits too: orjson refuses it
    return _cap(repr(value), MAX_FIELD_CHARS, redactor)


def _scalars(entry: dict[str, Any], redactor: Redactor | None = None) -> dict[str, Any]:
    return {k: _scalar(v, redactor) for k, v in entry.items()}


#: ``log_format`` values: ``auto`` = text when stderr is a terminal, else JSON
LOG_FORMATS = ("auto", "json", "text")


def _text_value(value: Any) -> str:
    if isinstance(value, str):
        if value and not any(c.isspace() or c in '"=' for c in value):
            return value
        return orjson.dumps(value).decode()
    if isinstance(value, bool) or value is None:
        return orjson.dumps(value).decode()
    if isinstance(value, (int, float)):
        return repr(value)
    try:
        return orjson.dumps(value, default=repr).decode()
    except TypeError:
        return repr(value)[:2000]


def render_text(entry: dict[str, Any]) -> bytes:
    """``<ts> LEVEL   logger: msg key=value …`` (and the traceback, indented, below)."""
    head = f"{entry.pop('ts')} {entry.pop('level').upper():<7} {entry.pop('logger')}: "
    parts = [head + str(entry.pop("msg"))]
    exc = entry.pop("exc", "")
    parts += [f"{key}={_text_value(value)}" for key, value in entry.items()]
    line = " ".join(parts)
    if exc:
        line += "\n" + "\n".join("    " + x for x in str(exc).splitlines())
    return line.encode(errors="replace")


def render_line(
    redactor: Redactor,
    clock: _Clock,
    created: float,
    level: str,
    logger: str,
    msg: str,
    fields: dict[str, Any] | None,
    exc: str = "",
    *,
    text: bool = False,
) -> bytes:
    entry: dict[str, Any] = {
        "ts": clock.stamp(created),
        "level": level,
        "logger": logger,
        "msg": msg if len(msg) <= MAX_FIELD_CHARS else _cap(msg, MAX_FIELD_CHARS, redactor),
    }
    rid, tid = request_id.get(), turn_id.get()
    if rid:
        entry["request_id"] = rid
    if tid:
        entry["turn_id"] = tid
    if exc:
        exc = _cap(exc, MAX_EXC_CHARS, redactor)
    if text:  # a terminal's line, not JSON: every form of every secret replaced
        _put_capped(entry, fields, exc, redactor)
        return redactor.redact_bytes(render_text(entry)) + b"\n"
    if fields:
        entry.update(fields)
    if exc:
        entry["exc"] = exc
    try:
        line = orjson.dumps(entry, default=repr)
        if len(line) > MAX_FIELD_CHARS and fields:
            # a string field may be over the cap (a line at most MAX_FIELD_CHARS bytes
            # long holds none: a character is at least a byte): cut them and encode
            # again. Most lines are far shorter, and skip the pass over their fields.
            _put_capped(entry, fields, exc, redactor)
            line = orjson.dumps(entry, default=repr)
    except TypeError:  # e.g. a peer's value nested deeper than orjson writes
        _put_capped(entry, fields, exc, redactor)
        entry = _scalars(entry, redactor)
        line = orjson.dumps(entry)
    if len(line) > MAX_LINE_BYTES:  # big containers (lists, dicts) in the fields
        entry = _scalars(entry, redactor)
        line = orjson.dumps(entry)
    if redactor.hit(line):  # rebuilt from the line: repr()-ed objects are strings by now
        line = orjson.dumps(redactor.value(orjson.loads(line)))
    return line + b"\n"


class EventLog:
    """The fast path for lines written on every request or turn."""

    def __init__(self, sink: LineSink | None, redactor: Redactor, level: int) -> None:
        self._clock = _Clock()
        self.configure(sink, redactor, level)

    def configure(
        self, sink: LineSink | None, redactor: Redactor, level: int, *, text: bool = False
    ) -> None:
        self._sink = sink
        self._redactor = redactor
        self.level = level
        self.text = text

    def redact(self, value: str) -> str:
        """``value`` with the process's secrets (those of :func:`setup_logging`) masked."""
        return self._redactor.text(value)

    def info(self, logger: str, msg: str, fields: dict[str, Any]) -> None:
        if self.level <= logging.INFO and self._sink is not None:
            self._sink.put(
                render_line(
                    self._redactor,
                    self._clock,
                    time.time(),
                    "info",
                    logger,
                    msg,
                    fields,
                    text=self.text,
                )
            )

    def warning(self, logger: str, msg: str, fields: dict[str, Any]) -> None:
        if self.level <= logging.WARNING and self._sink is not None:
            line = render_line(
                self._redactor,
                self._clock,
                time.time(),
                "warning",
                logger,
                msg,
                fields,
                text=self.text,
            )
            self._sink.put_now(line)


#: configured by :func:`setup_logging`; until then events go nowhere (library use, tests)
events = EventLog(None, Redactor(), logging.INFO)


def capped(value: str, limit: int) -> str:
    """``value`` cut to ``limit`` characters for a log field or a message that keeps
    an error's text. When it is cut, the process's secrets are masked first: a secret
    across the cut would no longer be whole, and its first characters would stay."""
    if len(value) <= limit:
        return value
    return events.redact(value)[:limit]


class JsonFormatter(logging.Formatter):
    """stdlib records as :func:`render_line` lines (``text``: the terminal format)."""

    def __init__(self, secrets: Iterable[str] = (), *, text: bool = False) -> None:
        super().__init__()
        self._redactor = Redactor(secrets)
        self._clock = _Clock()
        self.text = text

    def redact(self, text: str) -> str:
        return self._redactor.text(text)

    def render(self, record: logging.LogRecord) -> bytes:
        fields = {
            key: value
            for key, value in vars(record).items()
            if key not in _STANDARD and not key.startswith("_")
        }
        exc = self.formatException(record.exc_info) if record.exc_info else ""
        return render_line(
            self._redactor,
            self._clock,
            record.created,
            LEVEL_NAMES.get(record.levelno, record.levelname.lower()),
            record.name,
            record.getMessage(),
            fields,
            exc,
            text=self.text,
        )

    def format(self, record: logging.LogRecord) -> str:
        return self.render(record).decode().rstrip("\n")


class SinkHandler(logging.Handler):
    """stdlib records into the shared :class:`LineSink` (warnings and up written through)."""

    def __init__(self, sink: LineSink, formatter: JsonFormatter) -> None:
        super().__init__()
        self._sink = sink
        self._json = formatter
        self.setFormatter(formatter)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self._json.render(record)
        except Exception:
            self.handleError(record)
            return
        if record.levelno >= logging.WARNING:
            self._sink.put_now(line)
        else:
            self._sink.put(line)


_sink: LineSink | None = None


def text_format(log_format: str, fd: int = 2) -> bool:
    """``text`` → True, ``json`` → False, ``auto`` → whether ``fd`` is a terminal."""
    if log_format == "auto":
        try:
            return os.isatty(fd)
        except OSError:
            return False
    return log_format == "text"


def setup_logging(
    level: str,
    secrets: Iterable[str] = (),
    *,
    write: Callable[[bytes], None] | None = None,
    log_format: str = "json",
) -> LineSink:
    """Route every log line of the process through one sink (``write`` defaults to fd 2).

    ``log_format``: ``json`` (one object per line), ``text`` (for a terminal) or
    ``auto`` (text when stderr is a terminal, else JSON)."""
    global _sink
    # every request logs an audit line: skip the caller lookup (a stack walk per
    # record) and the thread/process names no line uses
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    if _sink is not None:
        _sink.close()
    secrets = tuple(secrets)
    text = text_format(log_format)
    sink = _sink = LineSink(write)
    handler = SinkHandler(sink, JsonFormatter(secrets, text=text))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    numeric = root.level
    events.configure(sink, Redactor(secrets), numeric, text=text)
    # aiohttp's access log duplicates our own request logging
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    atexit.register(sink.close)
    return sink


def dropped_lines() -> int:
    """Lines the process's sink could not write (stderr refused them, or its queue was
    full): ``xwm_log_lines_dropped_total``."""
    return _sink.dropped if _sink is not None else 0


def flush_logs(timeout: float = WRITE_THROUGH_WAIT) -> bool:
    """The lines logged so far written (at most ``timeout`` seconds: a forced exit and
    a failure said on stderr after the log lines must not wait on a wedged stderr)."""
    return _sink.sync(timeout) if _sink is not None else True
