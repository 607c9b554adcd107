"""Keyword lists of the auto router (routing.md §2.3) and token-aware matching.

The lists are the documented ones. Matching fixes weakness §9.2: a Latin
keyword matches only as whole words (an optional plural ``s``/``es`` is
allowed, and a digit may follow), so ``want`` no longer contains ``wan``, ``excellent`` no longer
contains ``excel``, ``research`` no longer contains ``search`` and
``password`` no longer contains ``word``. Keywords containing CJK characters
match as substrings, since those scripts have no word separators.
"""

from __future__ import annotations

import functools
import re

LOCAL = (
    "ppt", "pptx", "powerpoint", "word", "docx", "excel", "xlsx", "pdf",
    "image-resizer", "resize image", "compress image", "crop image",
)  # fmt: skip
ONLINE = (
    "image-cog", "wan", "video-translator", "browser", "search", "news", "资讯采集",
    "跨浏览器", "文生图", "文生视频", "图生视频", "视频翻译", "translate video", "dub video",
    "subtitles",
)  # fmt: skip
STRONG = (
    "multiple deliverables", "multiple outputs", "多个产物", "多个输出", "审阅", "复核",
    "汇编", "end-to-end", "end to end",
)  # fmt: skip
REVIEW = (
    "review", "audit", "verify", "summarize", "compare", "审阅", "复核", "汇总", "对比",
    "整理", "整合", "汇编",
)  # fmt: skip
MULTI_STEP = (
    "workflow", "pipeline", "step by step", "multi-step", "collect and", "analyze and",
    "review and", "compare and", "summarize and", "先", "然后", "之后",
)  # fmt: skip
STRUCTURED = (
    "report", "memo", "table", "spreadsheet", "document", "deck", "slides", "presentation",
    "报告", "总结", "表格", "文档", "演示",
)  # fmt: skip
COLLECTION = (
    "browser", "search", "news", "research", "crawl", "scrape", "跨浏览器", "搜索", "资讯",
    "采集", "检索",
)  # fmt: skip

_WORD_CHAR = "a-z0-9"
#: a longer keyword (a client's skill id or label) never matches: parsing its regex
#: costs about a microsecond per character on the event loop, and no skill name is
#: this long
MAX_KEYWORD = 256


def _has_cjk(text: str) -> bool:
    return any(ord(ch) > 0x2E7F for ch in text)


def _body(keyword: str) -> str:
    return r"[\s_]+".join(re.escape(part) for part in keyword.split())


@functools.lru_cache(maxsize=4096)
def _pattern(keywords: tuple[str, ...]) -> re.Pattern[str] | None:
    """One regex matching any of ``keywords`` (blank ones never match)."""
    words = [k.strip().lower() for k in keywords if k.strip()]
    cjk = [re.escape(k) for k in words if _has_cjk(k)]
    latin = [_body(k) for k in words if not _has_cjk(k)]
    parts = []
    if latin:
        # a digit may follow (``wan2.1``, ``pdf2``) but not a letter (``want``, ``newsletter``);
        # alternation backtracks, so ``ppt`` failing on ``pptx`` still lets ``pptx`` match
        parts.append(rf"(?<![{_WORD_CHAR}])(?:{'|'.join(latin)})(?:s|es)?(?![a-z])")
    if cjk:
        parts.append("|".join(cjk))
    return re.compile("|".join(parts)) if parts else None


def _one(keyword: str) -> re.Pattern[str] | None:
    """:func:`_compiled` of ``keyword``, through its cache only when it is short: a
    cache entry keeps its key, and an overlong keyword (a client's skill id or label, as
    long as a request body) would be held there with its ``None`` (4096 of them: GiBs)."""
    if len(keyword) > MAX_KEYWORD:
        keyword = keyword.strip()
        if len(keyword) > MAX_KEYWORD:
            return None
    return _compiled(keyword)


@functools.lru_cache(maxsize=4096)
def _compiled(keyword: str) -> re.Pattern[str] | None:
    """:func:`_pattern` of one keyword, with its literal first: ``re`` then skips to
    each occurrence as fast as ``str.find`` (a leading lookbehind made it try every
    position, 10x slower); the lookbehind after the first word checks the same boundary.
    ``None`` for a blank keyword or one longer than :data:`MAX_KEYWORD`."""
    word = keyword.strip().lower()
    if not word or len(word) > MAX_KEYWORD:
        return None
    if _has_cjk(word):
        return re.compile(re.escape(word))
    first, *rest = word.split()
    lead = re.escape(first)
    body = "".join(r"[\s_]+" + re.escape(part) for part in rest)
    return re.compile(rf"{lead}(?<![{_WORD_CHAR}]{lead}){body}(?:s|es)?(?![a-z])")


def contains(text: str, keyword: str) -> bool:
    """True if ``keyword`` occurs in ``text`` (any case) as a token (or CJK substring)."""
    return any_in(text.lower(), (keyword,))


def any_of(text: str, keywords: tuple[str, ...] | list[str]) -> bool:
    return any_in(text.lower(), keywords)


def any_in(lowered: str, keywords: tuple[str, ...] | list[str]) -> bool:
    """:func:`any_of` for a text already lower-cased (a caller matching many keyword
    lists against one prompt lowers it once)."""
    for keyword in keywords:
        # _one inlined for the common short keyword (no Python frame per keyword)
        pattern = _compiled(keyword) if len(keyword) <= MAX_KEYWORD else _one(keyword)
        if pattern is not None and pattern.search(lowered) is not None:
            return True
    return False


def needles(keywords: tuple[str, ...]) -> tuple[str, ...]:
    """Substrings one of which a text must contain for :func:`_pattern` to match it:
    each keyword's first word (its regex begins with that literal; CJK keywords are
    literals), without those that contain another."""
    words = {k.strip().lower() for k in keywords if k.strip()}
    firsts = {k if _has_cjk(k) else k.split()[0] for k in words}
    return tuple(sorted(n for n in firsts if not any(m != n and m in n for m in firsts)))


class Matcher:
    """:func:`any_of` for a fixed keyword list, compiled once (no cache lookup, which
    hashes the whole list, per call).

    A regex search of a prompt costs about 15 µs per KiB (the alternation is tried at
    every position); a text without any keyword's first word cannot match, and ``in``
    tells that in well under a microsecond per word, so most prompts skip the regex.
    """

    __slots__ = ("_needles", "_search")

    def __init__(self, keywords: tuple[str, ...]) -> None:
        pattern = _pattern(keywords)
        self._search = pattern.search if pattern is not None else None
        self._needles = needles(keywords)

    def __call__(self, text: str) -> bool:
        if self._search is None:
            return False
        lowered = text.lower()
        # the needle loop in C (``map``/``any``): a catalog's ~80 needles were ~340
        # bytecodes per prompt as a Python loop
        if any(map(lowered.__contains__, self._needles)):
            return self._search(lowered) is not None
        return False


_LOCAL, _ONLINE, _STRONG = Matcher(LOCAL), Matcher(ONLINE), Matcher(STRONG)
_REVIEW, _MULTI_STEP = Matcher(REVIEW), Matcher(MULTI_STEP)
_STRUCTURED, _COLLECTION = Matcher(STRUCTURED), Matcher(COLLECTION)


def looks_local(prompt: str) -> bool:
    return _LOCAL(prompt)


def looks_online(prompt: str) -> bool:
    return _ONLINE(prompt)


def looks_complex(prompt: str) -> bool:
    if _STRONG(prompt):
        return True
    review = _REVIEW(prompt)
    multi = _MULTI_STEP(prompt)
    structured = _STRUCTURED(prompt)
    if _COLLECTION(prompt) and structured:
        return True
    return sum((review, multi, structured)) >= 2
