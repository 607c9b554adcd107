"""xwm_bridge.httpbody.read_capped over a real socket: bodies from 1 KB up to the
upstream cap are read to their end; one byte more is refused (issue 16 item 2). The
upstream client (providers/http1.py) is covered through the daemon in
test_hostile_peers.py."""

from __future__ import annotations

import aiohttp
import pytest
from aiohttp import web

from tests.conftest import ServeApp
from xwm_bridge.httpbody import BodyTooLarge, read_capped
from xwm_bridge.providers.upstream import MAX_UPSTREAM_RESPONSE

SIZES = [1024, 100 * 1024, 130 * 1024, 1024 * 1024, 16 * 1024 * 1024, MAX_UPSTREAM_RESPONSE]


def body_app() -> web.Application:
    async def handle(request: web.Request) -> web.StreamResponse:
        size = int(request.query["size"])
        if request.query.get("chunked") != "1":
            return web.Response(body=b"x" * size)
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        piece = b"x" * 65536
        left = size
        while left:
            n = min(left, len(piece))
            await resp.write(piece[:n])
            left -= n
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/", handle)
    return app


@pytest.fixture
async def url(serve_app: ServeApp) -> str:
    return await serve_app(body_app())


@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("size", SIZES)
async def test_bodies_up_to_the_cap_are_read_whole(url: str, size: int, chunked: bool) -> None:
    async with (
        aiohttp.ClientSession() as http,
        http.get(url, params={"size": size, "chunked": int(chunked)}) as resp,
    ):
        data = await read_capped(resp, MAX_UPSTREAM_RESPONSE)
    assert len(data) == size


@pytest.mark.parametrize("chunked", [False, True])
async def test_one_byte_past_the_cap_is_refused(url: str, chunked: bool) -> None:
    cap = 256 * 1024
    async with aiohttp.ClientSession() as http:
        async with http.get(url, params={"size": cap, "chunked": int(chunked)}) as resp:
            assert len(await read_capped(resp, cap)) == cap
        async with http.get(url, params={"size": cap + 1, "chunked": int(chunked)}) as resp:
            with pytest.raises(BodyTooLarge, match=str(cap)):
                await read_capped(resp, cap)


def envelope_app() -> web.Application:
    """A plain-JSON upstream whose result output is ``size`` bytes (chunked or not)."""

    async def handle(request: web.Request) -> web.StreamResponse:
        import orjson

        body = orjson.loads(await request.read())
        size, chunked = int(request.match_info["size"]), request.match_info["chunked"]
        head = b'{"jsonrpc":"2.0","id":"%s","result":{"output":"' % body["id"].encode()
        tail = b'"}}'
        data = head + b"o" * max(size - len(head) - len(tail), 0) + tail
        if chunked != "1":
            return web.Response(body=data, content_type="application/json")
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for i in range(0, len(data), 1 << 20):
            await resp.write(data[i : i + (1 << 20)])
        await resp.write_eof()
        return resp

    app = web.Application(client_max_size=1 << 20)
    app.router.add_post("/{size}/{chunked}/acp/rpc", handle)
    return app


@pytest.mark.parametrize("chunked", [False, True])
async def test_the_upstream_client_reads_plain_json_up_to_the_cap(
    serve_app: ServeApp, chunked: bool
) -> None:
    """Through the upstream client the daemon uses (providers/http1.py)."""
    from xwm_bridge.config import ProviderConfig
    from xwm_bridge.endpoint import derive_endpoint
    from xwm_bridge.providers.http1_pool import Http1Pool
    from xwm_bridge.providers.upstream import UpstreamClient, UpstreamError

    base = await serve_app(envelope_app())
    pool = Http1Pool()
    client = UpstreamClient(pool)

    async def ignore(_: object) -> None:
        return None

    try:
        for size in SIZES:
            url = f"{base}/{size}/{int(chunked)}"
            provider = ProviderConfig("p", endpoint=url, stream=False)
            reply = await client.call(
                provider, derive_endpoint(url), "", "session.start", {}, ignore, stream=False
            )
            assert len(reply["result"]["output"]) > size - 100, size
        url = f"{base}/{MAX_UPSTREAM_RESPONSE + 1}/{int(chunked)}"
        provider = ProviderConfig("p", endpoint=url, stream=False)
        with pytest.raises(UpstreamError, match="too large"):
            await client.call(
                provider, derive_endpoint(url), "", "session.start", {}, ignore, stream=False
            )
    finally:
        await pool.close()
