"""TurnContext.relay_many: every frame in the ledger, one batch to the client when it can."""

from __future__ import annotations

from typing import Any

from xwm_bridge.core.context import TurnContext
from xwm_bridge.tasks import Supervisor

FRAMES = [
    {"jsonrpc": "2.0", "method": "session.update", "params": {"delta": str(i)}} for i in range(3)
]


def context(**kw: Any) -> tuple[TurnContext, list[Any]]:
    seen: list[Any] = []

    def ledger(messages: list[dict[str, Any]], relayed: bool) -> None:
        seen.extend(("ledger", m["params"]["delta"], relayed) for m in messages)

    ctx = TurnContext(None, None, "turn-1", supervisor=Supervisor(), ledger=ledger, **kw)  # type: ignore[arg-type]
    return ctx, seen


async def test_one_batch_when_the_transport_takes_batches() -> None:
    async def notify(message: dict[str, Any]) -> None:
        seen.append(("one", message))

    async def notify_many(messages: list[dict[str, Any]]) -> None:
        seen.append(("many", [m["params"]["delta"] for m in messages]))

    ctx, seen = context(notify=notify, notify_many=notify_many)
    await ctx.relay_many(FRAMES)
    assert seen == [
        ("ledger", "0", True),
        ("ledger", "1", True),
        ("ledger", "2", True),
        ("many", ["0", "1", "2"]),
    ]


async def test_one_by_one_otherwise_and_in_order() -> None:
    async def notify(message: dict[str, Any]) -> None:
        seen.append(("one", message["params"]["delta"]))

    ctx, seen = context(notify=notify)
    await ctx.relay_many(FRAMES)
    assert [s for s in seen if s[0] == "one"] == [("one", "0"), ("one", "1"), ("one", "2")]


async def test_ledger_only_without_a_client_channel() -> None:
    ctx, seen = context(notify=None)
    await ctx.relay_many(FRAMES)
    assert len(seen) == 3


async def test_ledger_writes_wait_for_the_store_to_keep_up() -> None:
    import asyncio

    gate = asyncio.Event()
    sent: list[str] = []

    async def writable() -> None:
        await gate.wait()

    async def notify(message: dict[str, Any]) -> None:
        sent.append(message["params"]["delta"])

    ctx, _ = context(notify=notify, writable=writable)
    relay = asyncio.ensure_future(ctx.relay_many(FRAMES))
    done, _ = await asyncio.wait({relay}, timeout=0.05)
    assert not done and sent == []  # held back while the store is behind
    gate.set()
    await asyncio.wait_for(relay, 5)
    assert sent == ["0", "1", "2"]
