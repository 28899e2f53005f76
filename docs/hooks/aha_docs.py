"""MkDocs hooks for aha's documentation site (mkdocs.yml `hooks:`): the parts of the site that are generated from
the code at build time, so they cannot drift from it.

- configuration.md: `<!-- aha:config-fields -->` becomes one table per config dataclass of aha.config.schema,
  every field with its type, default and docstring (what `aha train --help` prints).
- from-trl.md: `<!-- aha:trl-unsupported -->` becomes the table of TRL fields aha refuses and what to use instead
  (aha.config.trl.UNSUPPORTED), `<!-- aha:trl-aliases -->` the TRL names it translates (aha.config.trl.ALIASES),
  `<!-- aha:trl-fields -->` every own field of TRL's GRPOConfig with aha's decision (aha.config.trl.decide) and
  `<!-- aha:trl-no-effect -->` the fields taken that change nothing (aha.config.trl.NO_EFFECT).
- api/: one page per room of aha (a top-level module or package), `::: module` for it and each of its modules,
  found by walking aha/ when the site is built: a new module appears in the reference by itself.
- benchmarks.md and changelog.md: the repository's BENCHMARKS.md and CHANGELOG.md, with the files they link to.
- `<!-- smoke: ... -->` above a code block (the shortened run tests/test_docs.py makes of it) is shown on the page.
"""

from __future__ import annotations

import dataclasses
import json
import re
import typing
from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "aha"
SKIP_ROOMS = {"examples"}  # example configs and scripts to copy, not API
FROM_REPO = {"benchmarks.md": "BENCHMARKS.md", "changelog.md": "CHANGELOG.md"}
"""Site page -> repository file shown as that page."""
LINK = re.compile(r"(!?\[[^\]]*\]\()([^)\s]+)(\))")


# ---- the API reference ----------------------------------------------------------------------------------------

def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_public(path: Path) -> bool:
    rel = path.relative_to(PACKAGE).parts
    return not any(p.startswith("_") and p != "__init__.py" for p in rel) and "__pycache__" not in rel


def rooms() -> dict[str, list[str]]:
    """Room of aha -> its modules, in order: `aha.algos` -> [aha.algos]; `aha.config` -> [aha.config,
    aha.config.errors, ...]. A package without `__init__.py` (a namespace package) lists only its modules."""
    out: dict[str, list[str]] = {"aha": ["aha"]}
    for path in sorted(PACKAGE.iterdir()):
        if path.name.startswith(("_", ".")) or path.name in SKIP_ROOMS:
            continue
        if path.suffix == ".py":
            out[_module_name(path)] = [_module_name(path)]
        elif path.is_dir():
            mods = sorted({_module_name(p) for p in path.rglob("*.py") if _is_public(p)},
                          key=lambda m: (m.count("."), m))
            if mods:
                out[f"aha.{path.name}"] = mods
    return out


def _first_line(module: str) -> str:
    """The first line of a module's docstring, read without importing it."""
    import ast
    base = ROOT.joinpath(*module.split("."))
    path = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
    if not path.is_file():
        return "(a namespace package: its modules below)"
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def api_page(room: str, modules: list[str]) -> str:
    lines = [f"# {room}", ""]
    for mod in modules:
        if mod == room and len(modules) > 1:  # a package: its docstring; its members are shown where defined
            lines += [f"::: {mod}", "    options:", "      members: false", ""]
        else:
            lines += [f"::: {mod}", ""]
    return "\n".join(lines)


def api_index(all_rooms: dict[str, list[str]]) -> str:
    lines = ["# API reference", "",
             "Generated from the docstrings when the site is built (mkdocstrings over every public module of aha; "
             "`docs/hooks/aha_docs.py` finds them). One page per room of the package, as in "
             "[Design](../design.md#layout).", "",
             "| room | modules | what it is |", "|---|---|---|"]
    for room, mods in all_rooms.items():
        lines.append(f"| [`{room}`]({room}.md) | {len(mods)} | {_escape(_first_line(room))} |")
    return "\n".join(lines) + "\n"


# ---- the configuration reference ------------------------------------------------------------------------------

def _escape(text: str) -> str:
    """Markdown-safe outside code spans: a docstring's <think>, [N, F], a|b or a_b_c stay literal in a table."""
    parts = text.split("`")
    for i in range(0, len(parts), 2):  # even parts are outside backticks
        parts[i] = re.sub(r"([\\*_\[\]|<>])", r"\\\1", parts[i])
    for i in range(1, len(parts), 2):
        parts[i] = parts[i].replace("|", "\\|")
    return "`".join(parts)


def config_classes() -> list[type]:
    """Every config dataclass of aha.config (schema.py, and any module added beside it) that is not only a base of
    others, in the order of the files."""
    import importlib
    import pkgutil

    import aha.config
    classes = []
    for info in pkgutil.iter_modules(aha.config.__path__, "aha.config."):
        module = importlib.import_module(info.name)
        classes += [c for c in vars(module).values() if isinstance(c, type) and dataclasses.is_dataclass(c)
                    and c.__module__ == module.__name__ and c not in classes]
    bases = {b for c in classes for b in c.__mro__[1:]}
    return [c for c in classes if c not in bases]


def _commands(cls: type) -> str:
    from aha.cli import CLI_STAGES
    from aha.stages import STAGES
    names = [n for n, s in STAGES.items() if s.config is cls]
    said = [f"`aha {n}`" for n in names if n in CLI_STAGES] + [f"recipe stage `{n}`" for n in names]
    return ", ".join(said)


def config_fields() -> str:
    from aha.config import field_docs
    from aha.config.parse import _type_name
    out = []
    for cls in config_classes():
        docs, hints = field_docs(cls), typing.get_type_hints(cls)
        where = _commands(cls)
        out += [f"## {cls.__name__}", "", (f"Used by {where}. " if where else "") + _escape(
            " ".join((cls.__doc__ or "").split())), "",
            f"{len(dataclasses.fields(cls))} fields.", "",
            "| field | type | default | what it sets |", "|---|---|---|---|"]
        for f in dataclasses.fields(cls):
            if f.default is not dataclasses.MISSING:
                default = json.dumps(f.default, default=str)
            elif f.default_factory is not dataclasses.MISSING:
                default = json.dumps(f.default_factory(), default=str)
            else:
                default = "required"
            out.append(f"| `{f.name}` | {_escape(_type_name(hints[f.name]))} | `{default.replace('|', '¦')}` | "
                       f"{_escape(docs.get(f.name, ''))} |")
        out.append("")
    return "\n".join(out)


def trl_unsupported() -> str:
    from aha.config.trl import ALREADY, UNSUPPORTED
    lines = ["| TRL field | why aha refuses it, and what to use instead | values taken (they ask for what aha does) |",
             "|---|---|---|"]
    for name, why in UNSUPPORTED.items():
        taken = ", ".join(f"`{json.dumps(v)}`" for v in ALREADY.get(name, ()))
        lines.append(f"| `{name}` | {_escape(why)} | {taken or '–'} |")
    lines.append("| every `vllm_*` with `use_vllm=true` | " + _escape(UNSUPPORTED["use_vllm"]) + " | – |")
    return "\n".join(lines)


def trl_fields() -> str:
    """Every own field of the pinned TRL's GRPOConfig and what aha does with it (aha.config.trl.decide)."""
    from aha.config import GRPOConfig
    from aha.config.trl import TRL_FIELDS, TRL_VERSION, decide
    ours = {f.name for f in dataclasses.fields(GRPOConfig)}
    lines = [f"| TRL {TRL_VERSION} `GRPOConfig` field | aha | how, or why not |", "|---|---|---|"]
    for name in TRL_FIELDS:
        kind, why = decide(name, ours) or ("undecided", "")
        lines.append(f"| `{name}` | {kind} | {_escape(why)} |")
    return "\n".join(lines)


def trl_no_effect() -> str:
    from aha.config.trl import NO_EFFECT
    lines = ["| field | why nothing changes |", "|---|---|"]
    lines += [f"| `{name}` | {_escape(why)} |" for name, why in NO_EFFECT.items()]
    return "\n".join(lines)


def trl_aliases() -> str:
    from aha.config.trl import ALIASES
    lines = ["| TRL name | what sets it in aha |", "|---|---|"]
    for name, fn in ALIASES.items():
        lines.append(f"| `{name}` | {_escape(' '.join((fn.__doc__ or fn.__name__).split()))} |")
    return "\n".join(lines)


MARKERS = {"<!-- aha:config-fields -->": config_fields, "<!-- aha:trl-unsupported -->": trl_unsupported,
           "<!-- aha:trl-aliases -->": trl_aliases, "<!-- aha:trl-fields -->": trl_fields,
           "<!-- aha:trl-no-effect -->": trl_no_effect}


# ---- pages from the repository --------------------------------------------------------------------------------

def _repo_links(markdown: str, files: Files, config) -> str:
    """Links of a repository file shown as a page: docs/X -> X, README.md -> index.md, and any other file it
    links to (a figure under benchmarks/results/) is added to the site at the same path."""
    def fix(m: re.Match) -> str:
        target = m.group(2)
        if re.match(r"^[a-z]+:|^#", target):
            return m.group(0)
        path, _, anchor = target.partition("#")
        if path.startswith("docs/"):
            path = path[len("docs/"):]
        elif path == "README.md":
            path = "index.md"
        elif path.upper() in {v.upper() for v in FROM_REPO.values()}:
            path = next(k for k, v in FROM_REPO.items() if v.upper() == path.upper())
        elif (ROOT / path).is_file() and files.get_file_from_path(path) is None:
            files.append(File.generated(config, path, abs_src_path=str(ROOT / path)))
        return m.group(1) + path + ("#" + anchor if anchor else "") + m.group(3)
    return LINK.sub(fix, markdown)


# ---- the hooks ------------------------------------------------------------------------------------------------

def on_config(config, **kwargs):
    """The nav's "API reference" entry gets one page per room."""
    pages = [{"Overview": "api/index.md"}] + [{room: f"api/{room}.md"} for room in rooms()]
    for i, item in enumerate(config.nav or []):
        if isinstance(item, dict) and "API reference" in item:
            config.nav[i] = {"API reference": pages}
    return config


def on_files(files: Files, config, **kwargs):
    all_rooms = rooms()
    files.append(File.generated(config, "api/index.md", content=api_index(all_rooms)))
    for room, modules in all_rooms.items():
        files.append(File.generated(config, f"api/{room}.md", content=api_page(room, modules)))
    for page, source in FROM_REPO.items():
        text = (ROOT / source).read_text()
        files.append(File.generated(config, page, content=_repo_links(text, files, config)))
    return files


SMOKE = re.compile(r"^<!-- smoke: (.*?) -->$", re.M)
"""The overrides tests/test_docs.py runs a block with; shown on the site above the block they shorten."""


def on_page_markdown(markdown: str, page, config, files, **kwargs):
    for marker, make in MARKERS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, make())
    return SMOKE.sub(lambda m: f"*Tested by the suite with* `{m.group(1)}`\n", markdown)
