"""Sans-I/O: what an HTTP/1.1 message's framing fields say (RFC 9112 §6).

The bridge implements one transfer coding, ``chunked``, as every HTTP/1.1 recipient
must. Both of its servers (the ``/acp/rpc`` front and aiohttp) and its upstream client
(``providers/http1.py``) decide a ``Transfer-Encoding`` with :func:`transfer_refusal`,
so they agree, and read a ``Content-Length`` with :func:`announced`.
"""

from __future__ import annotations

#: the answer to a request whose transfer codings the bridge does not implement
NOT_IMPLEMENTED = 501
#: the answer to a request whose body cannot be framed
BAD_FRAMING = 400


def transfer_refusal(value: str) -> int:
    """0 when ``value`` (every ``Transfer-Encoding`` line, joined by commas) is a lone
    ``chunked`` (any case; empty list elements ignored, RFC 9110 §5.6.1);
    :data:`BAD_FRAMING` (400) when ``chunked`` is not the final coding, or is applied
    twice (§6.1, §6.3: the body length cannot be determined; the server MUST answer
    400 and close); else :data:`NOT_IMPLEMENTED` (501: ``chunked`` after a coding the
    bridge does not implement, such as ``gzip, chunked``; §6.1)."""
    if value == "chunked":  # what nearly every chunked message says
        return 0
    codings = [c for c in (part.strip(" \t").lower() for part in value.split(",")) if c]
    if codings == ["chunked"]:
        return 0
    if not codings or codings[-1] != "chunked" or codings.count("chunked") > 1:
        return BAD_FRAMING
    return NOT_IMPLEMENTED


def announced(length: str | None) -> int:
    """The size a ``Content-Length`` announces, -1 for none (or not one number). The
    parser has refused one past 64 bits, but not its leading zeros: they are dropped
    before ``int``, which refuses more than 4300 digits (a ValueError where it was
    called on the field: in the front's parser callback, ``rpc_expect``, the upstream
    client)."""
    if length is None:
        return -1
    if length.isdigit() and length.isascii() and len(length) <= 20:
        return int(length)  # the common case: a plain number (leading zeros or not)
    text = length.strip(" \t")
    digits = text.lstrip("0") or text[-1:]
    if not digits.isascii() or not digits.isdigit() or len(digits) > 20:
        return -1
    return int(digits)
