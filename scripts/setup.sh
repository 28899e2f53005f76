#!/usr/bin/env bash
# Creates the virtualenv at .venv (once, and again whenever pyproject.toml changes) and installs aha.
# Sourced by scripts/demo.sh and scripts/test.sh; safe to run by hand.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
stamp=.venv/.aha-installed
want="$(sha1sum pyproject.toml scripts/setup.sh | sha1sum | cut -c1-40)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then exit 0; fi

echo "[setup] creating .venv and installing aha (first run only; a few minutes)" >&2
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# torch first, pinned, so that the resolver never swaps in a multi-GB CUDA build on a CPU machine.
if ! .venv/bin/python -c 'import torch' 2>/dev/null; then
  .venv/bin/python -m pip install -q "${AHA_TORCH_SPEC:-torch==2.13.0}"
fi
.venv/bin/python -m pip install -q -e ".[dev]"

# bubblewrap gives the code sandbox its namespaces; without it aha falls back to rlimits + no-network.
if ! command -v bwrap >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null) \
      || echo "[setup] could not install bubblewrap; code rewards will use the fallback sandbox" >&2
  else
    echo "[setup] bubblewrap not found (install it: apt-get install bubblewrap); code rewards will use the fallback sandbox" >&2
  fi
fi
# Debian's chromium and its driver run the dashboard's browser tests (Selenium); without them those tests are
# skipped, except in CI (CI=true), where a missing browser fails them.
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null) \
      || echo "[setup] could not install chromium; the dashboard browser tests will be skipped" >&2
  else
    echo "[setup] chromium not found (install it: apt-get install chromium chromium-driver); the dashboard browser tests will be skipped" >&2
  fi
fi
echo "$want" > "$stamp"
