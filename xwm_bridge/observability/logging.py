"""One JSON object per line on stderr, with every configured secret redacted."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterable
from typing import Any

import orjson

from xwm_bridge.observability.context import request_id, turn_id

_STANDARD = frozenset(
    vars(logging.LogRecord("x", logging.INFO, "x", 0, "x", None, None)).keys()
) | {"message", "asctime", "taskName"}
REDACTED = "[REDACTED]"


class JsonFormatter(logging.Formatter):
    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        # longest first, so a "Bearer x" value is replaced before its bare "x"
        self._secrets = sorted({s for s in secrets if s}, key=len, reverse=True)
        self._second = -1
        self._stamp = ""

    def _ts(self, created: float, msecs: float) -> str:
        second = int(created)
        if second != self._second:  # strftime once per second, not per line
            self._second = second
            self._stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return f"{self._stamp}.{int(msecs):03d}Z"

    def redact(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        return text

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": self._ts(record.created, record.msecs),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        rid, tid = request_id.get(), turn_id.get()
        if rid:
            entry["request_id"] = rid
        if tid:
            entry["turn_id"] = tid
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        line = orjson.dumps(entry, default=repr).decode()
        return self.redact(line)


def setup_logging(level: str, secrets: Iterable[str] = ()) -> None:
    # every request logs an audit line: skip the caller lookup (a stack walk per
    # record) and the thread/process names no line uses
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(secrets))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # aiohttp's access log duplicates our own request logging
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
