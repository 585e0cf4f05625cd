#!/usr/bin/env bash
# The GPU measurements issues 43 and 47 wait for, as one call on a lent GPU machine (run from the
# repository root; the ignored folder runs/gpu carried: quick/ model, before/ = 979b027's transformer/,
# before47/ = the trainer before issue 47's first change, data/ = test2016, site/ = tomli_w, sacremoses;
# benchmarks/gpu_prepare.sh builds it):
#   bash benchmarks/gpu_visit.sh decode   # ~3 min: compile_step (CUDA graph) + gpu_decode before/after
#   bash benchmarks/gpu_visit.sh train    # ~5 min: the fused loss alone (fused_loss.py), then gpu.py base and big,
#                                         # bf16 and compiled, profiled, before/after
# Results land in benchmarks/results/ and, with $OUT set, are copied there. Their commit fields come from
# the device's git metadata, which can be stale: set them by hand after copying back.
set -eu
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 TRANSFORMER_DATA=$PWD/runs/gpu/data
export PYTHONPATH=$PWD:$PWD/runs/gpu/site${PYTHONPATH:+:$PYTHONPATH}
case "${1:-}" in decode|train) ;; *) echo "usage: bash benchmarks/gpu_visit.sh decode|train" >&2; exit 2 ;; esac
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
R=benchmarks/results
case "$1" in
  decode)
    python benchmarks/compile_step.py --device cuda --run runs/gpu/quick --steps 300 | tail -5
    python benchmarks/gpu_decode.py --before runs/gpu/before --device cuda --runs quick=runs/gpu/quick \
      --batches 1 64 512 | tail -12
    files="$R/compile_step_cuda.json $R/compile_step_cuda.md $R/gpu_decode.json $R/gpu_decode.md" ;;
  train)
    python benchmarks/fused_loss.py | tail -2
    python benchmarks/gpu.py --before runs/gpu/before47 --models base,big --modes bf16,bf16+compile --steps 20 \
      | tail -30
    files="$R/fused_loss.json $R/fused_loss.md $R/gpu_train.json $R/gpu_train.md" ;;
esac
if [ -n "${OUT:-}" ]; then cp $files "$OUT"/; fi
