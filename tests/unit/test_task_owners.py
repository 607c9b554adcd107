"""Every task has an owner: no ``create_task``/``ensure_future`` outside the ones listed.

A task is started through the ``Supervisor`` (``xwm_bridge/tasks.py``) or a
``TaskGroup``; the few others are held by one object or one function, which
ends them. This test finds every other call in ``xwm_bridge/`` and checks that
it is listed below with its owner, and that the owner ends it: a task kept on
``self`` is cancelled, or awaited under ``asyncio.wait_for``, by its class; a
task kept in a local name is cancelled in a ``finally`` of its function.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "xwm_bridge"

#: (module, enclosing function) → who owns the task started there
OWNED: dict[tuple[str, str], str] = {
    ("xwm_bridge.tasks", "Supervisor.spawn"): "the supervisor itself",
    ("xwm_bridge.transport.front", "FrontProtocol._enqueue"): (
        "its connection: cancelled when the client goes, bounded by Front.shutdown"
    ),
    ("xwm_bridge.store.redis", "RedisStore.start"): "the store: stopped in close()",
    ("xwm_bridge.store.redis", "RedisStore._ensure_running"): "the store: stopped in close()",
    ("xwm_bridge.store.cluster", "Cluster.start"): "the cluster: cancelled in close()",
    ("xwm_bridge.client", "Client.__aenter__"): "the client: cancelled in __aexit__",
    ("xwm_bridge.app.bridge", "Bridge._wait_turns"): "the function: both waiters cancelled",
    ("xwm_bridge.cli.client", "client_watch"): "the function: both waiters cancelled",
}


@dataclass(frozen=True)
class Site:
    module: str
    where: str  # Class.method or function
    line: int
    target: str  # "self.x", a local name, or "" (not kept)
    cls: ast.ClassDef | None
    func: ast.AST


def _is_task_call(node: ast.Call, groups: set[str]) -> bool:
    func = node.func
    if isinstance(func, ast.Attribute) and func.attr == "ensure_future":
        return True
    if not (isinstance(func, ast.Attribute) and func.attr == "create_task"):
        return False
    # group.create_task(...) inside ``async with asyncio.TaskGroup() as group``
    return not (isinstance(func.value, ast.Name) and func.value.id in groups)


def _task_groups(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.AsyncWith):
            for item in node.items:
                call = item.context_expr
                if (
                    isinstance(call, ast.Call)
                    and isinstance(call.func, ast.Attribute)
                    and call.func.attr == "TaskGroup"
                    and isinstance(item.optional_vars, ast.Name)
                ):
                    names.add(item.optional_vars.id)
    return names


def _target(func: ast.AST, call: ast.Call) -> str:
    for node in ast.walk(func):
        if isinstance(node, ast.Assign) and node.value is call:
            t = node.targets[0]
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name):
                return f"{t.value.id}.{t.attr}"
            if isinstance(t, ast.Name):
                return t.id
    return ""


def sites_in(path: Path, root: Path = PACKAGE) -> list[Site]:
    tree = ast.parse(path.read_text(), str(path))
    groups = _task_groups(tree)
    module = ".".join(path.relative_to(root.parent).with_suffix("").parts)
    found: list[Site] = []

    def visit(node: ast.AST, cls: ast.ClassDef | None, func: ast.AST | None, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, child, None, child.name)
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = (
                    f"{cls.name}.{child.name}" if cls is not None and func is None else child.name
                )
                visit(child, cls, child if func is None else func, name if func is None else where)
            else:
                if (
                    isinstance(child, ast.Call)
                    and _is_task_call(child, groups)
                    and func is not None
                ):
                    found.append(Site(module, where, child.lineno, _target(func, child), cls, func))
                visit(child, cls, func, where)

    visit(tree, None, None, "")
    return found


def all_sites() -> list[Site]:
    return [s for path in sorted(PACKAGE.rglob("*.py")) for s in sites_in(path)]


def _ends_self_task(cls: ast.ClassDef, attr: str) -> bool:
    """``self.<attr>.cancel()``, ``wait_for(self.<attr>, …)`` or ``stop(self.<attr>, …)``
    in the class."""
    for node in ast.walk(cls):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if (
            isinstance(f, ast.Attribute)
            and f.attr == "cancel"
            and isinstance(f.value, ast.Attribute)
            and f.value.attr == attr
        ):
            return True
        waits = (isinstance(f, ast.Attribute) and f.attr in ("wait_for", "stop")) or (
            # tasks.wait_for cancels it too; tasks.stop cancels it until it ends
            isinstance(f, ast.Name) and f.id in ("wait_for", "stop")
        )
        if waits and node.args:
            first = node.args[0]
            if isinstance(first, ast.Attribute) and first.attr == attr:
                return True
    return False


def _cancelled_in_finally(func: ast.AST, name: str) -> bool:
    for node in ast.walk(func):
        if isinstance(node, ast.Try):
            for stmt in node.finalbody:
                for sub in ast.walk(stmt):
                    if (
                        isinstance(sub, ast.Call)
                        and isinstance(sub.func, ast.Attribute)
                        and sub.func.attr == "cancel"
                        and isinstance(sub.func.value, ast.Name)
                        and sub.func.value.id == name
                    ):
                        return True
    return False


def test_every_raw_task_is_listed_with_its_owner() -> None:
    unlisted = [
        f"{s.module}:{s.line} in {s.where}" for s in all_sites() if (s.module, s.where) not in OWNED
    ]
    assert not unlisted, (
        "start tasks through the Supervisor or a TaskGroup, or list the owner here: "
        + ", ".join(unlisted)
    )


def test_every_listed_site_still_exists() -> None:
    present = {(s.module, s.where) for s in all_sites()}
    assert sorted(set(OWNED) - present) == []


@pytest.mark.parametrize("site", all_sites(), ids=lambda s: f"{s.module}:{s.where}")
def test_the_owner_ends_the_task(site: Site) -> None:
    if site.module == "xwm_bridge.tasks":
        return  # the supervisor's own tasks: tests/unit/test_tasks.py
    if site.target.startswith("self."):
        assert site.cls is not None
        attr = site.target.split(".", 1)[1]
        assert _ends_self_task(site.cls, attr), f"{site.cls.name} never cancels {site.target}"
    else:
        assert site.target, f"{site.module}:{site.line}: a task not kept cannot be ended"
        assert _cancelled_in_finally(site.func, site.target), (
            f"{site.where}: {site.target} is not cancelled in a finally"
        )


def test_the_check_catches_an_unowned_task(tmp_path: Path) -> None:
    """The finder sees a stray task, and a kept one its class never ends."""
    src = (
        "import asyncio\n"
        "class Holder:\n"
        "    def start(self):\n"
        "        self._t = asyncio.get_running_loop().create_task(work())\n"
        "    async def run(self):\n"
        "        async with asyncio.TaskGroup() as group:\n"
        "            group.create_task(work())\n"
        "async def stray():\n"
        "    asyncio.ensure_future(work())\n"
    )
    pkg = tmp_path / "xwm_bridge"
    pkg.mkdir()
    path = pkg / "sample.py"
    path.write_text(src)
    sites = sites_in(path, root=pkg)
    assert [(s.where, s.target) for s in sites] == [("Holder.start", "self._t"), ("stray", "")]
    holder = sites[0].cls
    assert holder is not None and not _ends_self_task(holder, "_t")
