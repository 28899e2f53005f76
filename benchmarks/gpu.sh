#!/usr/bin/env bash
# The GPU figures of BENCHMARKS.md ("GPU"), in one pass: the CUDA tests, generation tokens/s of aha's engine
# (CUDA graphs and eager) and `model.generate` on a Qwen2-0.5B-shaped model in bfloat16 at 64, 256 and 1,024
# tokens, aha vs TRL s/step at 512-token completions (bf16 mixed precision), the training phase's MFU, and where
# the time of ten aha steps goes (benchmarks/step_phases.py: a step whose shapes are new shows there).
#
#   bash benchmarks/gpu.sh OUT_DIR        # python3 must have torch (CUDA), transformers, pytest; TRL for vs_trl
#   PARTS="tests vs_trl" bash benchmarks/gpu.sh OUT_DIR                 # some parts only
#   GEN_ARGS="--only generate --max-new 1024" PARTS=generation bash benchmarks/gpu.sh OUT_DIR
#
# Each part has its own time limit, so one that fails or hangs does not take the others with it.
set -u
OUT=${1:-benchmarks/results/gpu}
PY=${PYTHON:-python3}
PARTS=${PARTS:-tests vs_trl roofline phases generation}
GEN_ARGS=${GEN_ARGS:---max-new 64 256 1024 --repeats 2 --warmup-new 64}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false TRANSFORMERS_VERBOSITY=error HF_HUB_OFFLINE=1
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD"
quiet() { grep -v -e "Writing model shards" -e "Loading weights" -e "^\s*$"; }
part() { [[ " $PARTS " == *" $1 "* ]]; }

{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv
  $PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
  $PY -c "import trl; print('trl', trl.__version__)" 2>&1 | tail -1; } 2>&1 | tee "$OUT/gpu.txt"
part tests && timeout 120 $PY -m pytest -m gpu -rs tests/test_rollout.py 2>&1 | tail -15 | tee "$OUT/tests.txt"
part vs_trl && timeout 300 $PY benchmarks/vs_trl.py --device cuda --sizes qwen2-0.5b --bf16 --steps 5 --rounds 1 \
    --curve-steps 0 --check-steps 0 --max-completion-length 512 --out "$OUT" 2>&1 | quiet | tail -25 \
    | tee "$OUT/vs_trl.txt"
part roofline && [ -f "$OUT/vs_trl.json" ] && timeout 80 $PY benchmarks/train_roofline.py "$OUT/vs_trl.json" \
    --tokens 2048 8192 2>&1 | quiet | tee "$OUT/roofline.txt"
part phases && timeout 150 $PY benchmarks/step_phases.py --device cuda --size qwen2-0.5b --bf16 \
    --max-completion-length 512 --steps 10 --steps-no-gc 0 2>&1 | quiet | tee "$OUT/step_phases.txt"
# shellcheck disable=SC2086
part generation && timeout 300 $PY benchmarks/generation.py --device cuda --size qwen2-0.5b --arch qwen2 \
    --vocab-size 151936 --dtype bfloat16 $GEN_ARGS --json "$OUT/generation.json" 2>&1 | quiet | tee "$OUT/generation.txt"
exit 0
