#!/usr/bin/env bash
# The main job on the embedded default: tiny model built in code -> SFT -> GRPO -> before/after.
# Installs aha and its dependencies only (no test tools, no sandbox, no browser): scripts/setup.sh demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh demo
exec .venv/bin/aha demo "$@"
