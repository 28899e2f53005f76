#!/usr/bin/env bash
# The test command: sets up .venv for the tests on first use (scripts/setup.sh test: the `test` extra, and as root
# bubblewrap and Chromium for the sandbox and browser tests), then runs the whole suite, the docs site's strict
# build (tests/test_docs.py) and the wheel install check (tests/test_package.py) included.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
exec .venv/bin/python -m pytest "$@"
