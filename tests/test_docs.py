"""The documentation: the README stays short and links every result to where it was measured, the site builds
with `mkdocs build --strict` (broken links, anchors and API references fail), its generated configuration page
holds every field, and every code block of the Quickstart and From TRL pages runs.

Code blocks run in order, per page, in a scratch folder laid out like a clone (scripts/, pyproject.toml and a link
to .venv). A comment `<!-- smoke: key=value ... -->` right above a block shortens it: each key's value in the
block (`key=v` or `--key v`) is replaced, and a key the block does not have is appended to its `aha <stage>` or
`scripts/demo.sh` command lines. The comment is in the page's source for anyone to read.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
README_MAX_LINES = 250
EXECUTED_PAGES = ("quickstart.md", "from-trl.md")
STAGE_COMMAND = re.compile(r"(\baha (demo|train|sft|eval|sample|recipe)\b|scripts/demo\.sh)")
FENCE = re.compile(r"(?:<!-- smoke: (?P<smoke>[^>]*?) -->\n)?```(?P<lang>\w+)\n(?P<code>.*?)\n```", re.S)


# ---- the README -----------------------------------------------------------------------------------------------

def _github_slug(heading: str) -> str:
    """GitHub's anchor for a heading (and the site's: mkdocs.yml uses pymdownx's gfm slugify)."""
    text = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {_github_slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.M)}


def _links(text: str) -> list[str]:
    return re.findall(r"\]\(([^)\s]+)\)", text)


def test_readme_is_short():
    n = len(README.read_text().splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines; move detail into docs/ (at most {README_MAX_LINES})"


def test_readme_links_resolve():
    """Every relative link of the README names a file that exists, and every anchor a heading in it."""
    bad = []
    for link in _links(README.read_text()):
        if re.match(r"^[a-z]+:", link):
            continue
        path, _, anchor = link.partition("#")
        target = ROOT / path if path else README
        if not target.exists():
            bad.append(f"{link}: no such file")
        elif anchor and target.suffix == ".md" and anchor not in _anchors(target):
            bad.append(f"{link}: no heading with that anchor in {path or 'README.md'}")
    assert not bad, bad


RESULT = re.compile(r"\d+(\.\d+)?\s?(%|x\b|points\b|min\b|minutes\b|s per step|GB\b)|\d\.\d+x"
                    r"|\[[+-]?\d+(\.\d+)?, [+-]?\d+(\.\d+)?\]")
"""A measured result: a percentage, a ratio (2.08x), a gain in points, a time or a memory size, or an interval."""


def _units(markdown: str) -> list[tuple[int, str]]:
    """(first line, text) of each paragraph and each table row outside code blocks; tables' header rows and
    HTML comments left out."""
    text = re.sub(r"<!--.*?-->", lambda m: "\n" * m.group(0).count("\n"), markdown, flags=re.S)
    lines, out, para, start, in_code = text.split("\n"), [], [], 0, False
    for n, line in enumerate(lines, 1):
        if line.startswith("```"):
            in_code = not in_code
            continue
        if in_code:
            continue
        if line.startswith("|"):
            following = lines[n] if n < len(lines) else ""
            if not re.match(r"^\|[-| :]+\|$", line) and not re.match(r"^\|[-| :]+\|$", following):
                out.append((n, line))
        elif line.strip():
            para, start = para + [line], start or n
            continue
        if para:
            out.append((start, " ".join(para)))
        para, start = [], 0
    if para:
        out.append((start, " ".join(para)))
    return out


def test_readme_results_link_to_their_source():
    """No result in the README without a link, in the same paragraph or table row, to BENCHMARKS.md or the docs
    page that holds its command and machine."""
    unlinked = [f"README.md:{n}: {text[:120]}" for n, text in _units(README.read_text())
                if RESULT.search(re.sub(r"95% (CI|confidence|interval)", "", text))
                and not re.search(r"\]\((BENCHMARKS\.md|docs/)[^)]*\)", text)]
    assert not unlinked, "results without a link to their source:\n" + "\n".join(unlinked)


def test_readme_result_check_sees_results():
    assert RESULT.search("gain +44.5 points") and RESULT.search("2.08x") and RESULT.search("75.5% [69.1, 80.9]")
    assert RESULT.search("about 7 to 9 minutes") and RESULT.search("4.85 s per step") and RESULT.search("1.9 GB")
    assert not RESULT.search("bash scripts/demo.sh") and not RESULT.search("Python 3.10+")


def test_readme_python_example_is_the_tested_one():
    """The README's example is From TRL's first block, which test_code_blocks_run runs."""
    def first_python(path: Path) -> str:
        return next(m["code"] for m in FENCE.finditer(path.read_text()) if m["lang"] == "python")
    assert first_python(README) == first_python(DOCS / "from-trl.md")


# ---- the site -------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, "mkdocs build --strict failed:\n" + proc.stdout[-4000:] + proc.stderr[-4000:]
    return out


def _text(html: str) -> str:
    return re.sub(r"<[^>]+>", " ", html)


def test_site_builds_strict_with_every_page(site):
    for page in ("quickstart", "from-trl", "configuration", "tasks", "recipe", "evaluation", "distributed",
                 "dashboard", "models", "results", "reliability", "design", "install", "training", "speed",
                 "benchmarks", "changelog", "api"):
        assert (site / page / "index.html").is_file(), page


def test_configuration_page_has_every_field(site):
    """Generated from the dataclasses at build time: a field added to any config appears without a docs edit."""
    from aha.config import schema
    page = (site / "configuration" / "index.html").read_text()
    configs = [cls for cls in vars(schema).values()
               if isinstance(cls, type) and dataclasses.is_dataclass(cls) and cls.__module__ == schema.__name__]
    assert {"GRPOConfig", "SFTConfig", "EvalConfig", "DemoConfig"} <= {c.__name__ for c in configs}
    bases = {b for c in configs for b in c.__mro__[1:]}
    configs = [c for c in configs if c not in bases]  # a base's fields are in each of its subclasses' tables
    missing = []
    for cls in configs:
        section = page.split(f'<h2 id="{cls.__name__.lower()}"', 1)[-1].split("<h2 ", 1)[0]
        missing += [f"{cls.__name__}.{f.name}" for f in dataclasses.fields(cls) if f"<code>{f.name}</code>" not in section]
    assert not missing, missing


def test_api_reference_covers_every_module(site):
    """One page per room of aha, each documenting its modules (a module added later appears by itself)."""
    sys.path.insert(0, str(DOCS / "hooks"))
    try:
        from aha_docs import rooms
    finally:
        sys.path.pop(0)
    for room, modules in rooms().items():
        page = (site / "api" / room / "index.html").read_text()
        for mod in modules:
            assert f'id="{mod}"' in page, f"{mod} is not documented on api/{room}"
    assert "aha.train.grpo" in rooms()["aha.train"]


def test_from_trl_page_lists_every_refused_trl_field(site):
    from aha.config.trl import ALIASES, UNSUPPORTED
    text = _text((site / "from-trl" / "index.html").read_text())
    assert all(name in text for name in [*UNSUPPORTED, *ALIASES])


# ---- executed code blocks -------------------------------------------------------------------------------------

def code_blocks(page: Path) -> list[tuple[str, str]]:
    """(language, code) of each fenced block, smoke overrides applied."""
    out = []
    for m in FENCE.finditer(page.read_text()):
        code = m.group("code")
        if m.group("smoke"):
            code = smoke(code, dict(kv.split("=", 1) for kv in m.group("smoke").split()))
        out.append((m.group("lang"), code))
    return out


def smoke(code: str, overrides: dict[str, str]) -> str:
    for key, value in overrides.items():
        pattern = re.compile(rf"(?<![\w-])(--{key}[ =]|{key}=)[^\s,)]+")
        if pattern.search(code):
            code = pattern.sub(lambda m: m.group(1) + value, code)
        else:
            code = "\n".join(line + f" {key}={value}" if STAGE_COMMAND.search(line) else line
                             for line in code.split("\n"))
    return code


def test_smoke_overrides():
    assert smoke("x = f(max_steps=30, lr=1)", {"max_steps": "2"}) == "x = f(max_steps=2, lr=1)"
    assert smoke("aha eval M --num_problems 200 --out d", {"num_problems": "9"}) == "aha eval M --num_problems 9 --out d"
    assert smoke("aha examples d\naha train c.yaml", {"save_steps": "0"}) == "aha examples d\naha train c.yaml save_steps=0"
    assert smoke("bash scripts/demo.sh", {"grpo_steps": "2"}) == "bash scripts/demo.sh grpo_steps=2"


def _scratch_clone(tmp: Path) -> Path:
    """A folder laid out like a clone for the blocks: scripts/ and pyproject.toml (so scripts/setup.sh finds its
    stamp current and installs nothing) and .venv linked to the real one."""
    subprocess.run(["bash", "scripts/setup.sh", "test"], cwd=ROOT, check=True, timeout=1800)  # a no-op once set up
    work = tmp / "clone"
    work.mkdir()
    shutil.copytree(ROOT / "scripts", work / "scripts")
    shutil.copy(ROOT / "pyproject.toml", work / "pyproject.toml")
    (work / ".venv").symlink_to(ROOT / ".venv")
    return work


@pytest.mark.slow
@pytest.mark.parametrize("page", EXECUTED_PAGES)
def test_code_blocks_run(page, tmp_path):
    blocks = code_blocks(DOCS / page)
    assert blocks, f"{page} has no code block"
    work = _scratch_clone(tmp_path)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "NO_MKDOCS_2_WARNING": "1"}
    for i, (lang, code) in enumerate(blocks):
        if lang == "python":
            script = work / f"block_{i}.py"
            script.write_text(code + "\n")
            cmd = [str(ROOT / ".venv/bin/python"), str(script)]
        elif lang == "bash":
            cmd = ["bash", "-euo", "pipefail", "-c", code]
        else:
            raise AssertionError(f"{page}: block {i} is `{lang}`, which this test cannot run; use bash or python")
        proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, (f"{page}, block {i} ({lang}) failed:\n{code}\n--- output ---\n"
                                      + proc.stdout[-3000:] + proc.stderr[-5000:])
