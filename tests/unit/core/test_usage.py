"""Turn usage from prompt answers and usage_update notifications, session totals."""

from __future__ import annotations

from xwm_bridge.core.usage import TurnUsage, Usage


def test_prompt_usage_and_cost_growth() -> None:
    t = TurnUsage(cost_before=1.0)
    t.observe_update({"sessionUpdate": "usage_update", "used": 10, "size": 100})
    t.observe_update({"used": 20, "size": 100, "cost": {"amount": 1.5, "currency": "USD"}})
    t.observe_answer(
        {
            "stopReason": "end_turn",
            "usage": {"inputTokens": 7, "outputTokens": 3, "totalTokens": 10},
        }
    )
    assert t.reported
    assert t.wire() == {
        "inputTokens": 7,
        "outputTokens": 3,
        "totalTokens": 10,
        "cost": {"amount": 0.5, "currency": "USD"},
        "contextUsed": 20,
        "contextSize": 100,
    }


def test_gemini_quota_meta_and_optional_counts() -> None:
    t = TurnUsage()
    t.observe_answer(
        {
            "stopReason": "end_turn",
            "_meta": {"quota": {"token_count": {"input_tokens": 4, "output_tokens": 2}}},
        }
    )
    assert t.result().wire() == {"inputTokens": 4, "outputTokens": 2, "totalTokens": 6}
    t2 = TurnUsage()
    t2.observe_answer(
        {"usage": {"inputTokens": 1, "outputTokens": 1, "totalTokens": 9, "thoughtTokens": 7}}
    )
    assert t2.result().wire()["thoughtTokens"] == 7 and t2.result().total == 9


def test_nothing_reported_and_garbage_ignored() -> None:
    t = TurnUsage()
    t.observe_answer({"stopReason": "end_turn"})
    t.observe_update({"used": "many", "cost": {"amount": "x"}})
    assert not t.reported and t.result().turns == 0
    assert Usage.from_wire({"inputTokens": -5, "outputTokens": True}).empty


def test_session_totals_round_trip_and_currency() -> None:
    a = Usage(input=1, output=2, total=3, cost=0.1, currency="USD", turns=1)
    b = Usage(input=4, output=5, total=9, cost=0.2, currency="USD", turns=1)
    total = a + b
    assert total.turns == 2 and total.total == 12 and abs(total.cost - 0.3) < 1e-9
    restored = Usage.from_record({"usage": total.record()})
    assert restored == total
    assert (a + Usage(cost=1.0, currency="EUR", turns=1)).currency == "mixed"
    assert Usage.from_record({"usage": "{not json"}) == Usage()
    assert Usage.from_record({}) == Usage()


def test_a_cumulative_cost_that_started_again() -> None:
    t = TurnUsage(cost_before=2.0)
    t.observe_update({"cost": {"amount": 0.3, "currency": "USD"}})
    assert t.result().cost == 0.3
