"""Layers point one way: no module under ``xwm_bridge/`` imports from a layer above it.

Ranks, lowest first (docs/architecture/index.md draws the same picture). Modules
of one rank may import each other only inside their own package.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "xwm_bridge"

LAYERS: list[tuple[str, ...]] = [
    # 0: sans-I/O helpers and observability, importable from anywhere
    (
        "__init__",
        "coerce",
        "jsonrpc",
        "sse",
        "framing",
        "imageref",
        "endpoint",
        "netaddr",
        "proxy",
        "llm",
        "wire",
        "httpbody",
        "codings",
        "observability",
        "tasks",
        "inflight",
        "beneath",
        "flock",
        "heap",
        "console",
        "procgroups",
    ),
    ("config",),  # 1: the typed config
    ("store", "router", "mounts", "config_doc", "config_view"),  # 2: services the core uses
    ("core",),  # 3: contracts: context, executors, sessions, queues, turns
    ("providers", "gateway", "multiagent"),  # 4: executors and their clients
    ("app",),  # 5: composition: the bridge object graph and its method table
    ("acp",),  # 6: the ACP front door (ACP sessions and methods over the bridge core)
    ("transport", "adapters", "toolbridge", "doctor"),  # 7: edges and other front ends
    ("cli", "__main__", "client"),  # 8: the command line and its terminal client
]
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}


def unit_of(module: str) -> str:
    """``xwm_bridge.core.turns`` → ``core``; ``xwm_bridge`` (or a name defined in its
    ``__init__``, such as ``__version__``) → ``__init__``."""
    parts = module.split(".")
    if len(parts) < 2:
        return "__init__"
    top = parts[1]
    exists = (PACKAGE / top).is_dir() or (PACKAGE / f"{top}.py").is_file()
    return top if exists else "__init__"


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1] if len(parts) > 1 else parts
    return ".".join(parts)


def imports_of(path: Path, package: str | None = None) -> list[tuple[int, str]]:
    """Every ``xwm_bridge`` module imported anywhere in the file (lazy and
    TYPE_CHECKING imports included: they are dependencies too)."""
    tree = ast.parse(path.read_text(), str(path))
    if package is None:
        name = module_name(path)
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("xwm_bridge")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            if name == "xwm_bridge":  # from xwm_bridge import coerce, jsonrpc
                found += [(node.lineno, f"xwm_bridge.{a.name}") for a in node.names]
            elif name.startswith("xwm_bridge."):
                found.append((node.lineno, name))
    return found


MODULES = sorted(PACKAGE.rglob("*.py"))


def test_every_top_level_unit_has_a_layer() -> None:
    units = {unit_of(module_name(p)) for p in MODULES}
    assert units <= set(RANK), f"add to LAYERS: {sorted(units - set(RANK))}"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_upward_or_sideways_import(path: Path) -> None:
    here = unit_of(module_name(path))
    bad = []
    for line, target in imports_of(path):
        there = unit_of(target)
        if there == here:
            continue
        if RANK[there] > RANK[here]:
            bad.append(f"line {line}: {target} (layer {RANK[there]} > {RANK[here]})")
        elif RANK[there] == RANK[here] and RANK[here] not in (0, RANK["cli"]):
            bad.append(f"line {line}: {target} (same layer {RANK[here]}, another package)")
    assert not bad, f"{path.relative_to(PACKAGE)} imports upward:\n" + "\n".join(bad)


def test_the_checker_sees_a_violation(tmp_path: Path) -> None:
    """The test above can fail: an upward import in core is reported."""
    core = PACKAGE / "core" / "turns.py"
    assert any(unit_of(t) == "store" for _, t in imports_of(core))
    fake = tmp_path / "x.py"
    fake.write_text("from xwm_bridge.app.bridge import Bridge\n")
    assert imports_of(fake, "xwm_bridge.core") == [(1, "xwm_bridge.app.bridge")]
    assert RANK[unit_of("xwm_bridge.app.bridge")] > RANK["core"]


#: the modules of ``config/``, lowest first: each may import only those before it
CONFIG_ORDER = ["secret_fields", "sections", "model", "env_vars", "validate", "loading", "__init__"]


def test_config_modules_import_one_way() -> None:
    """Inside ``config/`` imports point one way too: no cycle between its modules, and
    none of them imports the package itself."""
    rank = {name: i for i, name in enumerate(CONFIG_ORDER)}
    files = sorted((PACKAGE / "config").glob("*.py"))
    assert {p.stem for p in files} == set(CONFIG_ORDER), "add the new module to CONFIG_ORDER"
    bad = []
    for path in files:
        for line, target in imports_of(path):
            parts = target.split(".")
            if parts[:2] != ["xwm_bridge", "config"]:
                continue
            there = parts[2] if len(parts) > 2 else "__init__"
            if rank[there] >= rank[path.stem]:
                bad.append(f"config/{path.name} line {line}: {target}")
    assert not bad, "config modules import upward:\n" + "\n".join(bad)
