"""Failure reports that survive CPython < 3.11.8 (gh-106905), imported by ``conftest.py``.

There the AST constructor's recursion counter is shared by the whole interpreter: an
``ast.parse`` that runs while another one is building its tree breaks the outer one
(``SystemError: AST constructor recursion depth mismatch``). The garbage collector runs
in the middle of a big parse, and a finalizer it calls can parse too: an asyncio task
or future whose exception was never retrieved logs it, and 3.11's traceback parses
source for its ``~~~^^^`` marks. pytest parses source while it builds a failure's report,
and when it rewrites the asserts of a module imported late (a plugin importing its
package in ``pytest_terminal_summary``), so a failing test that left such an object
behind could end the whole run with ``INTERNALERROR`` instead of its report.

On those versions every ``ast.parse`` runs with the collector off: no finalizer runs
inside it, and no other thread gets the interpreter in the middle of it.
"""

from __future__ import annotations

import ast
import functools
import gc
import sys
from typing import Any

AFFECTED = sys.version_info < (3, 11, 8)


def _guarded(parse: Any) -> Any:
    @functools.wraps(parse)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        if not gc.isenabled():
            return parse(*args, **kwargs)
        gc.disable()
        try:
            return parse(*args, **kwargs)
        finally:
            gc.enable()

    guarded.__ast_guard__ = True  # type: ignore[attr-defined]
    return guarded


def install() -> None:
    if AFFECTED and not getattr(ast.parse, "__ast_guard__", False):
        ast.parse = _guarded(ast.parse)


install()
