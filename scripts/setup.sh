#!/usr/bin/env bash
# Creates the virtualenv at .venv and installs aha with what one purpose needs, once (and again whenever
# pyproject.toml or this script changes):
#   bash scripts/setup.sh demo   aha and its dependencies only (what `bash scripts/demo.sh` runs)
#   bash scripts/setup.sh test   the above plus the `test` extra (pytest, selenium, mkdocs, build, ...) and, as
#                                root with apt, Debian's bubblewrap (code sandbox) and chromium + chromium-driver
#                                (the dashboard's browser tests); what `bash scripts/test.sh` runs
#   bash scripts/setup.sh        the same as `test` (by hand: everything a contributor needs)
# Called by scripts/demo.sh and scripts/test.sh; safe to run by hand. AHA_SETUP_DRY_RUN=1 prints what it would
# install and installs nothing (tests/test_package.py checks that the demo's plan has no browser in it).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
purpose="${1:-test}"
case "$purpose" in
  demo) extras="" apt_packages="" ;;
  test) extras="[test]" apt_packages="bubblewrap chromium chromium-driver" ;;
  *) echo "usage: bash scripts/setup.sh [demo|test]" >&2; exit 2 ;;
esac

if [ -n "${AHA_SETUP_DRY_RUN:-}" ]; then
  echo "pip: ${AHA_TORCH_SPEC:-torch==2.13.0} -e .${extras}"
  echo "apt: ${apt_packages:-none}"
  exit 0
fi

stamp_of() { echo ".venv/.aha-installed-$1"; }
want="$(sha1sum pyproject.toml scripts/setup.sh | sha1sum | cut -c1-40)"
done_for() { [ -f "$(stamp_of "$1")" ] && [ "$(cat "$(stamp_of "$1")")" = "$want" ]; }
# the test set-up holds everything the demo needs
if done_for "$purpose" || { [ "$purpose" = demo ] && done_for test; }; then exit 0; fi

echo "[setup] installing aha for the ${purpose} into .venv (first run only; a few minutes)" >&2
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# torch first, pinned, so that the resolver never swaps in a multi-GB CUDA build on a CPU machine.
if ! .venv/bin/python -c 'import torch' 2>/dev/null; then
  .venv/bin/python -m pip install -q "${AHA_TORCH_SPEC:-torch==2.13.0}"
fi
.venv/bin/python -m pip install -q -e ".${extras}"

if [ "$purpose" = test ]; then
  # bubblewrap gives the code sandbox its namespaces; without it aha falls back to rlimits + no-network.
  # Debian's chromium and its driver run the dashboard's browser tests (Selenium); without them those tests are
  # skipped, except in CI (CI=true), where a missing browser fails them.
  missing=""
  command -v bwrap >/dev/null 2>&1 || missing=" bubblewrap"
  if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
    missing="$missing chromium chromium-driver"
  fi
  if [ -n "$missing" ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      # shellcheck disable=SC2086
      (apt-get update -qq && apt-get install -y -qq $missing >/dev/null) \
        || echo "[setup] could not install$missing: without bubblewrap code rewards use the fallback sandbox;" \
                "without chromium the dashboard browser tests are skipped (and fail under CI=true)" >&2
    else
      echo "[setup] not found:$missing (install: apt-get install$missing). Without bubblewrap code rewards use" \
           "the fallback sandbox; without chromium the dashboard browser tests are skipped" >&2
    fi
  fi
fi
echo "$want" > "$(stamp_of "$purpose")"
