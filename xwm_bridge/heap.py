"""The process heap after start-up, and the collector's pace.

What is alive once the daemon listens (modules, functions, config, routes, the
registry tables) lives as long as the process. :func:`freeze_startup` moves it
into the collector's permanent generation, so a full collection walks only what
sessions and turns allocated since (on the 20 ms bench this takes a full
collection from tens of milliseconds to a few).

It also raises the young generation's threshold from CPython's 700 to
:data:`YOUNG_THRESHOLD` allocations: a turn allocates about a thousand container
objects, nearly all freed by reference counting within the turn, so at 700 the
collector scanned each turn's live objects about once; at 10,000 most are gone
before a scan. Measured: about 5% less CPU per 20 ms turn, 3% per streamed turn
(performance.md). Cyclic garbage waits at most that many allocations longer.
"""

from __future__ import annotations

import gc

#: allocations (net, of container objects) between young-generation collections
YOUNG_THRESHOLD = 10_000
#: young collections between collections of the middle generation (CPython: 10)
MIDDLE_THRESHOLD = 20


def freeze_startup() -> int:
    """Collect once, freeze what is left, set the collector's pace; the number of
    frozen objects."""
    gc.collect()
    gc.freeze()
    _, _, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, MIDDLE_THRESHOLD, oldest)
    return gc.get_freeze_count()
