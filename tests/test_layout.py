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
            names = {f"{base}.{a.name}" for a in node.names}
            found |= names | ({base} if names - known else set())  # `from aha import algos` reads no name of aha
    return {m for m in found if m in known and m != name}


def test_no_import_cycle_between_modules():
    mods = _modules()
    graph = {name: _imports(name, tree, set(mods)) for name, tree in mods.items()}
    # a package's __init__ may gather its own submodules; an edge from a submodule back to its package is
    # Python's implicit parent import, not a cycle of the code. The top package is the exception: aha/__init__.py
    # imports the trainers (late), so a module that imports `aha` itself (`from .. import __version__`) closes one.
    for name in graph:
        graph[name] = {m for m in graph[name]
                       if "aha" in (name, m) or not (name.startswith(m + ".") or m.startswith(name + "."))}
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


def _package(module: str) -> str:
    """The room of aha a module lives in: aha.train.grpo -> aha.train, aha.algos -> aha.algos."""
    return ".".join(module.split(".")[:2])


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Rooms of aha and the rooms each imports (lazy imports included). No exception: a module that every box reads
    (the batch types, aha/batch.py) is a room of its own, below them all."""
    out = {}
    for name, deps in graph.items():
        if name == "aha":
            continue
        out.setdefault(_package(name), set()).update(
            _package(d) for d in deps if d != "aha" and _package(d) != _package(name))
    return out


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}

    def visit(node, path):
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt, path + [nxt])
                if found:
                    return found
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node, [node])
            if found:
                return found
    return None


def test_no_import_cycle_between_packages():
    """aha.train -> aha.dist -> aha.train would be one: the trainer builds the Ray pipeline, so the pipeline gets
    the experience box and the learner's class from it instead of importing the trainer's package."""
    mods = _modules()
    graph = {name: _imports(name, tree, set(mods)) for name, tree in mods.items()}
    assert graph["aha.batch"] == set()  # the batch types import nothing of aha
    cycle = _find_cycle(package_graph(graph))
    assert cycle is None, "import cycle between packages: " + " -> ".join(cycle)


def test_package_cycle_check_finds_one():
    graph = {"aha.train.grpo": {"aha.dist.pipeline"}, "aha.dist.pipeline": {"aha.train.learner"},
             "aha.train.learner": {"aha.algos"}, "aha.algos": set(), "aha.train.batch": set(),
             "aha.rollout.x": {"aha.train.batch"}}
    assert _find_cycle(package_graph(graph)) == ["aha.dist", "aha.train", "aha.dist"]
    graph["aha.dist.pipeline"] = {"aha.train.batch"}  # a module of the trainer's room: still a cycle
    assert _find_cycle(package_graph(graph)) == ["aha.dist", "aha.train", "aha.dist"]
    graph["aha.dist.pipeline"] = {"aha.batch"}  # the batch in its own room: none
    assert _find_cycle(package_graph(graph)) is None


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


ENGINE_CHECK_EXCEPTIONS = {"agent_speed.py": "scripted engine subclass"}
"""Benchmarks (file name -> why) allowed to build an engine other than through the registry."""
BENCHMARKS = sorted(p for p in (ROOT.parent / "benchmarks").glob("*.py") if p.name not in ENGINE_CHECK_EXCEPTIONS)
"""The benchmarks checked: those of a model's success sample as evaluation does, and those of the engine itself
pass its options through the registry (`get_engine("hf")(model, tok, max_batch, layer_cache=False)`)."""


def _engine_constructions(tree: ast.Module, classes: set[str]) -> list[int]:
    """Lines that build an engine directly: a call of an engine class (`HFEngine(...)`) or of a `for_model`
    constructor (`HFEngine.for_model(...)`)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            if name in classes or name == "for_model":
                lines.append(node.lineno)
    return lines


def test_engines_are_built_through_the_registry_outside_the_rollout_room():
    """One path samples: outside aha/rollout/ (benchmarks included) an engine comes from
    aha.rollout.get_engine(name), so every stage samples with the engine the run names."""
    from aha.rollout import ENGINES
    classes = {spec.rpartition(":")[2] for spec in ENGINES.values()}
    trees = {name: tree for name, tree in _modules().items() if not name.startswith("aha.rollout")}
    assert BENCHMARKS, "no benchmarks found to check"
    trees.update({f"benchmarks/{p.name}": ast.parse(p.read_text()) for p in BENCHMARKS})
    found = {name: lines for name, tree in trees.items() if (lines := _engine_constructions(tree, classes))}
    assert not found, f"engines built outside the registry (module: lines): {found}"


def test_the_engine_check_finds_a_direct_construction():
    tree = ast.parse("from aha.rollout import HFEngine\nengine = HFEngine.for_model(m, t)\nother = hf.HFEngine(m, [], 0)")
    assert _engine_constructions(tree, {"HFEngine"}) == [2, 3]
    assert _engine_constructions(ast.parse("engine = get_engine('hf')(m, t, 8)"), {"HFEngine"}) == []
