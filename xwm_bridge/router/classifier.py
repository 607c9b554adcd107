"""LLM routing classifier (routing.md §3), the auto-mode fallback.

Fixes weakness §9.1/§9.5: the server's ``LLM_API_KEY`` only ever goes to the
server-configured ``router.llm_base_url``; a client-supplied
``aiGatewayBaseUrl`` is used only together with the client's own
``aiGatewayApiKey``. Each call has a deadline from config, answers are cached
per (endpoint, model, prompt) hash for a TTL, identical concurrent questions
share one call, and a process-wide semaphore bounds the calls in flight. It is
plain async I/O, so a slow classifier only delays the thread that asked.

A shared call is a task of the classifier's own (with the call's deadline), not
of the turn that started it: a waiter whose turn is cancelled leaves, and the
others still get the answer; the call is cancelled when its last waiter leaves,
or at :meth:`Classifier.close`.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
import orjson

from xwm_bridge.httpbody import BodyTooLarge, read_capped
from xwm_bridge.llm import NO_CLIENT_TIMEOUT, normalize_base_url
from xwm_bridge.tasks import Supervisor

log = logging.getLogger("xwm_bridge.classifier")

SYSTEM_PROMPT = (
    "Classify the user task into exactly one label: single-agent, multi-agent, or gateway. "
    "Return only the label."
)
LABELS = ("single-agent", "multi-agent", "gateway")
_MAX_RESPONSE = 1024 * 1024


def parse_label(content: str) -> str:
    text = content.strip().lower()
    for label in LABELS:
        if label in text:
            return label
    return ""


def label_from_response(body: bytes) -> str:
    try:
        doc = orjson.loads(body)
        content = doc["choices"][0]["message"]["content"]
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
        return ""
    return parse_label(content) if isinstance(content, str) else ""


@dataclass(frozen=True, slots=True)
class Endpoint:
    base_url: str
    api_key: str = field(repr=False)


def choose_endpoint(
    client_base_url: str, client_api_key: str, server_base_url: str, server_api_key: str
) -> Endpoint | None:
    """Pair each key with its own side's URL; never the server key with a client URL."""
    if client_api_key.strip():
        return Endpoint(normalize_base_url(client_base_url or server_base_url), client_api_key)
    if server_api_key.strip():
        return Endpoint(normalize_base_url(server_base_url), server_api_key)
    return None


@dataclass(slots=True)
class _Shared:
    """One classifier call in flight, and how many questions wait for it."""

    task: asyncio.Task[str]
    waiters: int = 0


class Classifier:
    def __init__(
        self,
        http: aiohttp.ClientSession | None,
        *,
        model: str,
        timeout: float,
        cache_ttl: float,
        cache_entries: int,
        max_concurrency: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._http = http
        self._clock = clock  # the cache's expiry clock (tests pass their own)
        self._model = model
        self._timeout = timeout
        self._ttl = cache_ttl
        self._entries = max(cache_entries, 0)
        self._cache: OrderedDict[str, tuple[float, str]] = OrderedDict()
        self._inflight: dict[str, _Shared] = {}
        #: owner of the shared calls (a call outlives the turn that started it)
        self._tasks = Supervisor()
        self._closed = False
        self._slots = asyncio.Semaphore(max_concurrency)
        self.calls = 0  # upstream requests made (for tests and metrics)

    def _key(self, endpoint: Endpoint, prompt: str) -> str:
        h = hashlib.sha256()
        for part in (endpoint.base_url, endpoint.api_key, self._model, prompt):
            h.update(part.encode())
            h.update(b"\0")
        return h.hexdigest()

    async def classify(self, prompt: str, endpoint: Endpoint | None) -> str:
        """A label from :data:`LABELS`, or ``""`` for no answer (never raises; only
        the caller's own cancellation comes through)."""
        if endpoint is None or self._http is None or self._closed:
            return ""
        prompt = prompt.strip()
        key = self._key(endpoint, prompt)
        cached = self._cache.get(key)
        if cached is not None and cached[0] > self._clock():
            self._cache.move_to_end(key)
            return cached[1]
        shared = self._inflight.get(key)
        if shared is None:
            task = self._tasks.spawn(self._call(prompt, endpoint), name="classifier-call")
            shared = self._inflight[key] = _Shared(task)
            task.add_done_callback(lambda t: self._settled(key, shared))
        shared.waiters += 1
        try:
            # the call is not this caller's: its cancel ends the wait, not the call
            return await asyncio.shield(shared.task)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if shared.task.cancelled() and (current is None or not current.cancelling()):
                return ""  # the call was ended (close), not this caller
            raise
        except Exception:  # a bug in the call: the supervisor logged it
            return ""
        finally:
            shared.waiters -= 1
            if shared.waiters == 0 and not shared.task.done():
                # no one is left to answer: end the call; a new question starts anew
                if self._inflight.get(key) is shared:
                    del self._inflight[key]
                shared.task.cancel()

    def _settled(self, key: str, shared: _Shared) -> None:
        """The call ended: it leaves the in-flight map, and its answer is cached."""
        if self._inflight.get(key) is shared:
            del self._inflight[key]
        task = shared.task
        if task.cancelled() or task.exception() is not None:
            return
        label = task.result()
        if label and self._ttl > 0 and self._entries:
            self._cache[key] = (self._clock() + self._ttl, label)
            while len(self._cache) > self._entries:
                self._cache.popitem(last=False)

    async def close(self) -> None:
        """Cancel the calls in flight (their waiters get no answer) and ask no more."""
        self._closed = True
        await self._tasks.shutdown(0)
        self._inflight.clear()

    async def _call(self, prompt: str, endpoint: Endpoint) -> str:
        assert self._http is not None
        body = {
            "model": self._model,
            "messages": [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": prompt},
            ],
            "max_tokens": 4096,
            "stream": False,
        }
        headers = {
            "Content-Type": "application/json",
            "Authorization": f"Bearer {endpoint.api_key}",
        }
        try:
            async with asyncio.timeout(self._timeout), self._slots:
                self.calls += 1
                async with self._http.post(
                    f"{endpoint.base_url}/chat/completions",
                    data=orjson.dumps(body),
                    headers=headers,
                    allow_redirects=False,
                    # the deadline above alone: the shared session's (a 300 s total, a
                    # 30 s connect) cut a longer classifier_timeout short
                    timeout=NO_CLIENT_TIMEOUT,
                ) as resp:
                    if not 200 <= resp.status < 300:
                        log.info("classifier answered %s", resp.status)
                        return ""
                    raw = await read_capped(resp, _MAX_RESPONSE)
        except TimeoutError:
            log.info("classifier timed out")
            return ""
        except BodyTooLarge:
            log.info("classifier answer too large")
            return ""
        except (aiohttp.ClientError, ValueError, OSError) as exc:
            log.info("classifier failed: %s", type(exc).__name__)
            return ""
        return label_from_response(raw)
