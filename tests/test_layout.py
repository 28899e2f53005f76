"""The package's shape: no import cycle, no overlong function, one home for every config class."""

import ast
import dataclasses
from pathlib import Path

import aha

ROOT = Path(aha.__file__).parent
MAX_FUNCTION_LINES = 60


def _modules() -> dict[str, ast.Module]:
    out = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        out[name] = ast.parse(path.read_text())
    return out


def _imports(name: str, tree: ast.Module, known: set[str]) -> set[str]:
    """aha modules that `name` imports anywhere in its body (lazy imports inside functions included)."""
    package = name if name in known and any(k.startswith(name + ".") for k in known) else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}
    return {m for m in found if m in known and m != name}


def test_no_import_cycle_between_modules():
    mods = _modules()
    graph = {name: _imports(name, tree, set(mods)) for name, tree in mods.items()}
    # a package's __init__ may gather its own submodules; an edge from a submodule back to its package is
    # Python's implicit parent import, not a cycle of the code
    for name in graph:
        graph[name] = {m for m in graph[name] if not (name.startswith(m + ".") or m.startswith(name + "."))}
    state: dict[str, int] = {}

    def visit(node, path):
        state[node] = 1
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " -> ".join(path[path.index(nxt):] + [nxt]))
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for node in graph:
        if node not in state:
            visit(node, [node])


def test_cycle_check_finds_a_cycle():
    # the checker itself: a -> b -> a is reported
    a, b = ast.parse("from aha import b"), ast.parse("import aha.a")
    assert _imports("aha.a", a, {"aha.a", "aha.b"}) == {"aha.b"}
    assert _imports("aha.b", b, {"aha.a", "aha.b"}) == {"aha.a"}


def test_functions_are_short():
    long = []
    for name, tree in _modules().items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{name}.{node.name}: {n} lines")
    assert not long, long


def test_config_classes_live_in_aha_config():
    for name, tree in _modules().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name.endswith("Config") and not name.startswith("aha.config"):
                raise AssertionError(f"{name} defines {node.name}; configs belong in aha/config/schema.py")
    from aha import config
    assert all(dataclasses.is_dataclass(getattr(config, c)) for c in config.__all__ if c.endswith("Config"))
