#!/usr/bin/env bash
# The test command: creates .venv on first use (scripts/setup.sh), then runs the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
