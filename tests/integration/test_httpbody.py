"""xwm_bridge.httpbody.read_capped over a real socket: bodies from 1 KB up to the
upstream cap are read to their end; one byte more is refused (issue 16 item 2)."""

from __future__ import annotations

import aiohttp
import pytest
from aiohttp import web

from tests.conftest import ServeApp
from xwm_bridge.httpbody import BodyTooLarge, read_capped
from xwm_bridge.providers.upstream import MAX_UPSTREAM_RESPONSE, UpstreamError
from xwm_bridge.providers.upstream import read_capped as upstream_read

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
        data = await upstream_read(resp, MAX_UPSTREAM_RESPONSE)
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
        async with http.get(url, params={"size": cap + 1, "chunked": int(chunked)}) as resp:
            with pytest.raises(UpstreamError, match="too large"):
                await upstream_read(resp, cap)
