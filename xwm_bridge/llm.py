"""A minimal OpenAI-compatible chat-completions client (routing.md §3, adapters.md §2.5).

Shared by the toolbridge ``chat`` tool and multi-agent turns. Errors carry the
original's texts (``api error <status>: <body>``, ``missing choices in
response``, ``empty response content``). Every call has a deadline; redirects
are not followed (a 3xx is an ``api error``). The call's own key is masked
(``[REDACTED]``) in every text that comes back, an error or an answer: a peer
that quotes it (``Incorrect API key provided: sk-…``) must not put a client's key
into results, step updates or log lines, where only configured secrets are masked.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson

from xwm_bridge.httpbody import BodyTooLarge, read_capped
from xwm_bridge.observability.redact import MIN_SECRET_LEN, REDACTED

DEFAULT_BASE_URL = "https://api.openai.com/v1"
MAX_TOKENS = 4096
#: an error body quoted in a message is cut to this many characters
MAX_ERROR_BODY = 2000
MAX_RESPONSE_BYTES = 16 * 1024 * 1024
#: aiohttp's own limits off for a call: its deadline is ``ChatRequest.timeout``
NO_CLIENT_TIMEOUT = aiohttp.ClientTimeout()


class LLMError(Exception):
    """A failed completion, phrased as the original phrases it."""


class LLMRefusal(LLMError):
    """No content because the peer filtered it (``finish_reason: content_filter``):
    the model refused, a refused turn rather than a broken peer."""


def normalize_base_url(value: str) -> str:
    """Empty → the OpenAI default; ``…/v1`` kept; otherwise ``/v1`` appended (the
    §3 base URL rule, kept exactly, including ``/v1/`` → ``/v1/v1``; the classifier's
    too)."""
    url = value.strip()
    if not url:
        return DEFAULT_BASE_URL
    if url.endswith("/v1"):
        return url
    return url.rstrip("/") + "/v1"


@dataclass(frozen=True, slots=True)
class ChatRequest:
    base_url: str
    api_key: str = field(repr=False)
    model: str
    messages: list[dict[str, str]]
    timeout: float
    max_tokens: int = MAX_TOKENS

    def body(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "messages": self.messages,
            "max_tokens": self.max_tokens,
            "stream": False,
        }


def mask_key(text: str, key: str) -> str:
    """``text`` with ``key`` (the call's bearer) replaced by ``[REDACTED]``; a key
    shorter than the redactor's minimum would mask ordinary words and is left."""
    if len(key) >= MIN_SECRET_LEN and key in text:
        return text.replace(key, REDACTED)
    return text


def parse_completion(status: int, raw: bytes, key: str = "") -> str:
    """Sans-I/O: the trimmed ``choices[0].message.content`` or :class:`LLMError`;
    ``key`` is masked in both (before an error body is cut, so no prefix stays)."""
    return parse_choice(status, raw, key)[0]


def parse_choice(status: int, raw: bytes, key: str = "") -> tuple[str, str]:
    """:func:`parse_completion` and the choice's ``finish_reason`` (``stop``,
    ``length``, ``content_filter``…; ``""`` when the peer gave none)."""
    if not 200 <= status < 300:
        body = mask_key(raw.decode("utf-8", errors="replace"), key).strip()[:MAX_ERROR_BODY]
        raise LLMError(f"api error {status}: {body}")
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise LLMError(f"invalid JSON response: {exc}") from None
    choices = doc.get("choices") if isinstance(doc, dict) else None
    if not isinstance(choices, list) or not choices:
        raise LLMError("missing choices in response")
    first = choices[0] if isinstance(choices[0], dict) else {}
    message = first.get("message")
    content = message.get("content") if isinstance(message, dict) else None
    text = content.strip() if isinstance(content, str) else ""
    finish = first.get("finish_reason")
    if not text:
        if finish == "content_filter":
            raise LLMRefusal("empty response content (finish_reason content_filter)")
        raise LLMError("empty response content")
    return mask_key(text, key), finish if isinstance(finish, str) else ""


async def complete(http: aiohttp.ClientSession, req: ChatRequest) -> str:
    """POST ``<base>/chat/completions``; the whole exchange is bounded by ``req.timeout``.
    Every :class:`LLMError` text and the answer have ``req.api_key`` masked."""
    return (await complete_choice(http, req))[0]


async def complete_choice(http: aiohttp.ClientSession, req: ChatRequest) -> tuple[str, str]:
    """:func:`complete` and the answer's ``finish_reason`` (:func:`parse_choice`)."""
    try:
        return await _complete(http, req)
    except LLMError as exc:
        raise type(exc)(mask_key(str(exc), req.api_key)) from None


async def _complete(http: aiohttp.ClientSession, req: ChatRequest) -> tuple[str, str]:
    url = normalize_base_url(req.base_url) + "/chat/completions"
    if _has_credentials(url):
        # aiohttp refuses them beside a bearer (a bare ValueError), and its error texts
        # quote the URL: say so without repeating them into results and logs
        raise LLMError("llm request failed: the base URL must not carry credentials")
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {req.api_key}"}
    try:
        async with asyncio.timeout(req.timeout):
            # no redirects: the caller checked this URL's host (multi_agent.allowed_hosts),
            # not where a 307 would send the request, its body and its key
            async with http.post(
                url,
                data=orjson.dumps(req.body()),
                headers=headers,
                allow_redirects=False,
                # this call's deadline is the one above, alone: the session's (aiohttp's
                # default total of 300 s, its sock_connect of 30 s) cut a longer
                # ``req.timeout`` short, and the failure named ``req.timeout``
                timeout=NO_CLIENT_TIMEOUT,
            ) as resp:
                raw = await read_capped(resp, MAX_RESPONSE_BYTES)
                return parse_choice(resp.status, raw, req.api_key)
    except BodyTooLarge:
        raise LLMError(f"response larger than {MAX_RESPONSE_BYTES} bytes") from None
    except TimeoutError:
        raise LLMError(f"llm request timed out after {req.timeout:g}s") from None
    except aiohttp.NonHttpUrlClientError:  # its text is the URL: not repeated
        raise LLMError("llm request failed: the base URL is not http or https") from None
    except aiohttp.InvalidURL as exc:  # its text is the URL: not repeated
        detail = f": {exc.description}" if exc.description else ""
        raise LLMError(f"llm request failed: invalid URL{detail}") from None
    except aiohttp.ClientError as exc:
        raise LLMError(f"llm request failed: {exc}") from None
    except ValueError as exc:
        # aiohttp's refusals of client-chosen values (a control character in the key's
        # header): a failed turn, not an internal error
        raise LLMError(f"llm request failed: {exc}") from None


def _has_credentials(url: str) -> bool:
    try:
        return "@" in urlsplit(url).netloc
    except ValueError:
        return False  # unparseable: aiohttp says so (InvalidURL)
