"""router/keywords.py: the substring pre-filter never changes a Matcher's answer."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from xwm_bridge.router import keywords
from xwm_bridge.router.skills import CATALOG

LISTS = {
    "local": keywords.LOCAL,
    "online": keywords.ONLINE,
    "strong": keywords.STRONG,
    "review": keywords.REVIEW,
    "multi_step": keywords.MULTI_STEP,
    "structured": keywords.STRUCTURED,
    "collection": keywords.COLLECTION,
    "catalog": tuple(kw for _, _, kws in CATALOG for kw in kws),
}
FRAGMENTS = sorted({f for kws in LISTS.values() for k in kws for f in (k, *k.split())})
GLUE = ["", " ", "x", "s", "es", "2", "_", "-", ".", "\n", "İ", "Wan", "PPT"]


def test_needles_are_first_words_without_redundant_ones() -> None:
    assert keywords.needles(("ppt", "pptx", "resize image", "  ", "文生图")) == (
        "ppt",
        "resize",
        "文生图",
    )


def test_a_prompt_without_any_first_word_skips_the_regex() -> None:
    calls: list[str] = []
    matcher = keywords.Matcher(keywords.LOCAL)
    search = matcher._search
    assert search is not None

    def spy(text: str) -> object:
        calls.append(text)
        return search(text)

    matcher._search = spy
    assert not matcher("the quick brown fox " * 50)
    assert calls == []
    assert matcher("Please make a PPTX deck") and calls == ["please make a pptx deck"]


@settings(max_examples=400, deadline=None)
@given(
    st.sampled_from(sorted(LISTS)),
    st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.sampled_from(GLUE), st.text(max_size=4))),
)
def test_matcher_agrees_with_the_regex(name: str, parts: list[str]) -> None:
    text = "".join(parts)
    pattern = keywords._pattern(LISTS[name])
    assert pattern is not None
    expected = pattern.search(text.lower()) is not None
    assert keywords.Matcher(LISTS[name])(text) is expected
