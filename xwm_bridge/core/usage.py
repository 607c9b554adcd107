"""Token usage and cost of agent turns, per turn and summed per session (sans-I/O).

Sources, as agents send them:

* ``PromptResponse.usage`` — this turn's tokens (``inputTokens``, ``outputTokens``,
  ``totalTokens``, optional ``thoughtTokens``, ``cachedReadTokens``,
  ``cachedWriteTokens``);
* gemini-cli's ``PromptResponse._meta.quota.token_count`` (``input_tokens``,
  ``output_tokens``) when the standard field is absent;
* ``usage_update`` notifications — the context window (``used`` of ``size``
  tokens) and the *cumulative* cost of the agent's session (``cost: {amount,
  currency}``). A turn's cost is the growth of that figure during the turn (the
  whole figure when it went down: the agent's count started again).

The session totals live in the session record (``upstream["usage"]``, JSON) so
they survive restarts and show in ``session.replay``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import orjson

#: session-record key of the totals
RECORD_KEY = "usage"
TOKEN_FIELDS = (
    ("inputTokens", "input"),
    ("outputTokens", "output"),
    ("thoughtTokens", "thought"),
    ("cachedReadTokens", "cached_read"),
    ("cachedWriteTokens", "cached_write"),
)


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        return 0
    return int(value)


def _amount(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        return None
    return float(value) if value >= 0 else None


@dataclass(frozen=True, slots=True)
class Usage:
    input: int = 0
    output: int = 0
    thought: int = 0
    cached_read: int = 0
    cached_write: int = 0
    total: int = 0
    cost: float = 0.0
    currency: str = ""
    turns: int = 0

    @property
    def empty(self) -> bool:
        return not (self.total or self.input or self.output or self.cost)

    def __add__(self, other: Usage) -> Usage:
        currency = self.currency or other.currency
        if self.currency and other.currency and self.currency != other.currency:
            currency = "mixed"
        return Usage(
            input=self.input + other.input,
            output=self.output + other.output,
            thought=self.thought + other.thought,
            cached_read=self.cached_read + other.cached_read,
            cached_write=self.cached_write + other.cached_write,
            total=self.total + other.total,
            cost=round(self.cost + other.cost, 10),
            currency=currency,
            turns=self.turns + other.turns,
        )

    def wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "inputTokens": self.input,
            "outputTokens": self.output,
            "totalTokens": self.total,
        }
        for wire_name, name in TOKEN_FIELDS[2:]:
            if getattr(self, name):
                out[wire_name] = getattr(self, name)
        if self.cost or self.currency:
            out["cost"] = {"amount": self.cost, "currency": self.currency}
        return out

    def record(self) -> str:
        return orjson.dumps({**self.wire(), "turns": self.turns}).decode()

    @classmethod
    def from_wire(cls, data: Any) -> Usage:
        if not isinstance(data, dict):
            return cls()
        counts = {name: _count(data.get(wire_name)) for wire_name, name in TOKEN_FIELDS}
        total = _count(data.get("totalTokens"))
        if not total:
            total = counts["input"] + counts["output"] + counts["thought"]
        cost = data.get("cost")
        amount = _amount(cost.get("amount")) if isinstance(cost, dict) else None
        currency = str(cost.get("currency") or "")[:16] if isinstance(cost, dict) else ""
        return cls(
            **counts,
            total=total,
            cost=amount or 0.0,
            currency=currency if amount is not None else "",
            turns=_count(data.get("turns")),
        )

    @classmethod
    def from_record(cls, upstream: dict[str, str]) -> Usage:
        raw = upstream.get(RECORD_KEY)
        if not raw:
            return cls()
        try:
            return cls.from_wire(orjson.loads(raw))
        except orjson.JSONDecodeError:
            return cls()


def _gemini_quota(answer: dict[str, Any]) -> dict[str, Any] | None:
    meta = answer.get("_meta")
    quota = meta.get("quota") if isinstance(meta, dict) else None
    counts = quota.get("token_count") if isinstance(quota, dict) else None
    if not isinstance(counts, dict):
        return None
    return {
        "inputTokens": counts.get("input_tokens"),
        "outputTokens": counts.get("output_tokens"),
    }


@dataclass(slots=True)
class TurnUsage:
    """Collects one turn's usage from its ``usage_update``s and the prompt answer."""

    #: the agent's cumulative session cost before this turn (last one seen)
    cost_before: float | None = None
    cost_now: float | None = None
    currency: str = ""
    context_used: int | None = None
    context_size: int | None = None
    tokens: Usage = field(default_factory=Usage)

    def observe_update(self, update: dict[str, Any]) -> None:
        """One ``usage_update`` (the ``sessionUpdate`` object)."""
        if "used" in update:
            self.context_used = _count(update.get("used"))
        if "size" in update:
            self.context_size = _count(update.get("size"))
        cost = update.get("cost")
        if isinstance(cost, dict):
            amount = _amount(cost.get("amount"))
            if amount is not None:
                self.cost_now = amount
                self.currency = str(cost.get("currency") or "")[:16]

    def observe_answer(self, answer: Any) -> None:
        """The ``session/prompt`` result."""
        if not isinstance(answer, dict):
            return
        source = answer.get("usage")
        if not isinstance(source, dict):
            source = _gemini_quota(answer)
        if isinstance(source, dict):
            self.tokens = Usage.from_wire(source)

    def result(self) -> Usage:
        cost = 0.0
        if self.cost_now is not None:
            before = self.cost_before or 0.0
            # a lower figure: the agent's count started again (a restarted process)
            cost = self.cost_now - before if self.cost_now >= before else self.cost_now
        reported = not self.tokens.empty or self.cost_now is not None
        return replace(
            self.tokens,
            cost=round(cost, 10),
            currency=self.currency if self.cost_now is not None else "",
            turns=1 if reported else 0,
        )

    def wire(self) -> dict[str, Any]:
        out = self.result().wire()
        if self.context_used is not None:
            out["contextUsed"] = self.context_used
        if self.context_size is not None:
            out["contextSize"] = self.context_size
        return out

    @property
    def reported(self) -> bool:
        return self.result().turns > 0
