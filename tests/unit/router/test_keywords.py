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


def test_an_overlong_keyword_never_matches_nor_stays_compiled() -> None:
    # a client's skill id is a keyword: a 1.5 MB one took seconds of regex parsing on
    # the event loop and stayed cached (4096 of them); no skill name is that long
    long = "q" * (keywords.MAX_KEYWORD + 1)
    assert not keywords.any_of(f"use {long} now", [long, "   "])
    assert keywords.any_of(f"use {long[:-1]} now", [long[:-1]])
    assert not keywords.contains(long, long)


ODD = ["_x", "a_ b", "a", "b", "(", "-q", "q"]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from([*FRAGMENTS, *GLUE, *ODD]), max_size=8).map("".join),
    st.lists(st.sampled_from([*FRAGMENTS, *ODD]), min_size=1, max_size=4),
)
def test_any_of_agrees_with_one_alternation(text: str, words: list[str]) -> None:
    """Each keyword searched on its own (its literal first) answers as the one regex
    alternation of all of them did."""
    pattern = keywords._pattern(tuple(words))
    expected = pattern is not None and pattern.search(text.lower()) is not None
    assert keywords.any_of(text, words) is expected


def test_overlong_keywords_are_not_held_by_the_cache() -> None:
    # the cache kept each overlong keyword (a client's skill id, up to a request body)
    # as its key, None as its value: 4096 of them held GiBs
    import gc
    import tracemalloc

    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(32):
            long = f"{i:04d}" + "q" * (256 * 1024)
            assert not keywords.any_of("a prompt", [long])
            del long
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held < 1024 * 1024  # 8 MiB before the fix
    long = " " * 1000 + "pdf" + " " * 1000  # blanks around a keyword still do not count
    assert keywords.any_of("a pdf file", [long])
