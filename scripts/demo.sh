#!/usr/bin/env bash
# The main job on the embedded default: tiny model built in code -> SFT -> GRPO -> before/after.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/aha demo "$@"
