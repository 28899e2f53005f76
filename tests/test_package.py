"""aha installs like a package: `aha --version` prints the package's version, `python -m build` makes a wheel and
an sdist, and the wheel, installed with `--no-deps` into a fresh virtual environment that sees `.venv`'s packages
and run from outside the source tree, runs its commands and finds its example configs and dashboard files."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

import aha

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted(p.name for p in (ROOT / "aha" / "examples").glob("*.yaml"))
STATIC = sorted(str(p.relative_to(ROOT / "aha")) for p in (ROOT / "aha" / "dashboard" / "static").rglob("*")
                if p.is_file())


def test_version_is_one_value():
    """pyproject.toml reads its version from aha.__version__; the installed metadata and `aha --version` agree."""
    assert metadata.version("aha-rl") == aha.__version__
    out = subprocess.run([sys.executable, "-m", "aha.cli", "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"aha {aha.__version__}"


def test_demo_setup_installs_no_browser():
    """`bash scripts/demo.sh` sets up for the demo only; `bash scripts/test.sh` for the tests (browser included)."""
    env = {**os.environ, "AHA_SETUP_DRY_RUN": "1"}

    def plan(purpose):
        return subprocess.run(["bash", "scripts/setup.sh", purpose], cwd=ROOT, env=env, capture_output=True,
                              text=True, check=True).stdout

    demo, test = plan("demo"), plan("test")
    assert "apt: none" in demo and "[test]" not in demo and "chromium" not in demo
    assert "chromium chromium-driver" in test and "bubblewrap" in test and "-e .[test]" in test
    assert "setup.sh demo" in (ROOT / "scripts/demo.sh").read_text()
    assert "setup.sh test" in (ROOT / "scripts/test.sh").read_text()


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """The sdist, and the wheel built from it (`python -m build`, without isolation: no download)."""
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def test_wheel_and_sdist_hold_the_package(dist):
    wheel, = dist.glob(f"aha_rl-{aha.__version__}-py3-none-any.whl")
    sdist, = dist.glob(f"aha_rl-{aha.__version__}.tar.gz")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"aha/examples/{n}" for n in EXAMPLES} <= names
    assert {f"aha/{s}" for s in STATIC} <= names, sorted({f"aha/{s}" for s in STATIC} - names)
    assert "aha/train/grpo.py" in names and "aha/cli.py" in names
    with tarfile.open(sdist) as tar:
        held = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert {"pyproject.toml", "README.md", "CHANGELOG.md", "mkdocs.yml", "docs/quickstart.md"} <= held


CHECK_ASSETS = """
import re, sys
from pathlib import Path
import aha, aha.dashboard.server as server
from starlette.testclient import TestClient
assert not Path(aha.__file__).resolve().is_relative_to(Path(sys.argv[1])), aha.__file__
client = TestClient(server.build([], sys.argv[2], None, None, 30, 300.0), base_url="http://127.0.0.1")
page = client.get("/")
assert page.status_code == 200, page.status_code
assets = re.findall(r'(?:src|href)="(/static/[^"]+)"', page.text)
assert len(assets) > 10, assets
for url in assets:
    got = client.get(url)
    assert got.status_code == 200 and got.content, url
print(aha.__file__, len(assets))
"""


@pytest.mark.slow
def test_wheel_runs_outside_the_tree(dist, tmp_path):
    """The wheel with --no-deps in a new venv whose only other packages are .venv's (a .pth line: a venv made from
    .venv's python with --system-site-packages would see the base interpreter's packages, not .venv's), run from
    a folder outside the source tree."""
    wheel, = dist.glob("aha_rl-*.whl")
    env_dir = tmp_path / "venv"
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", "--system-site-packages", str(env_dir)],
                   check=True, timeout=120)
    py = env_dir / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "dot_venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # .venv's packages, after its own
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", "--no-index",
                    str(wheel)], check=True, timeout=300)
    away = tmp_path / "elsewhere"
    away.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    aha_cmd = env_dir / "bin" / "aha"

    def run(*args):
        proc = subprocess.run([str(aha_cmd), *args], cwd=away, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, (args, proc.stdout[-2000:], proc.stderr[-2000:])
        return proc.stdout

    assert run("--version").strip() == f"aha {aha.__version__}"
    assert "DemoConfig fields" in run("demo", "--help")
    assert "DashboardConfig fields" in run("dashboard", "--help")
    run("examples", "configs")
    assert sorted(p.name for p in (away / "configs").glob("*.yaml")) == EXAMPLES
    check = subprocess.run([str(py), "-c", CHECK_ASSETS, str(ROOT), str(away / "runs")], cwd=away, env=env,
                           capture_output=True, text=True, timeout=300)
    assert check.returncode == 0, check.stdout[-2000:] + check.stderr[-3000:]
    assert str(site) in check.stdout  # aha came from the wheel, not from the source tree
    shutil.rmtree(env_dir, ignore_errors=True)
