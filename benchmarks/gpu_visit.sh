#!/usr/bin/env bash
# The GPU measurements issues 43 and 47 wait for, as one call on a lent GPU machine (run from the
# repository root; the ignored folder runs/gpu carried: quick/ model, before/ = 979b027's transformer/,
# before47/ = the trainer before issue 47's first change, data/ = test2016, site/ = tomli_w, sacremoses;
# benchmarks/gpu_prepare.sh builds it):
#   bash benchmarks/gpu_visit.sh decode   # ~4 min: compile_step (CUDA graph) + gpu_decode before/after, then
#                                         # bf16_decode: translate --bf16 against fp32 on the GPU
#   bash benchmarks/gpu_visit.sh train-base   # gpu.py before/after, bf16, compiled and compiled with its graphs
#                                             # replayed as CUDA graphs (bf16+cudagraphs: what launching costs the
#                                             # host), profiled: base, with the micro-batch row, the loss curves and
#                                             # the first-shape cost (gpu_train.*), ~10 minutes: a call of its own
#   bash benchmarks/gpu_visit.sh train-big    # the same rows for big (gpu_train_big.*), then gpu_attention.py: each
#                                             # attention kernel alone at both models' sites (~10 s), and last,
#                                             # fused_loss.py: the loss kernel alone against a copy of its logits
#                                             # (these two's logs stay behind: $OUT takes 8 files, the cache's
#                                             # archive one of them). The two were one mode until 2026-12-04: the
#                                             # 2026-11-29 visit was cut at 560 s, and together they brought back
#                                             # more files than $OUT takes
#   bash benchmarks/gpu_visit.sh headline       # where device time is short (15 minutes a session, the machine's
#                                               # start included: train-base and train-big may not both fit), the
#                                               # issue's goal rows in two calls: gpu_layernorm.* (base's post-norm
#                                               # junction alone, in several ways) and gpu_attention.* (attention
#                                               # alone per kernel), short, then base in bf16 compiled, compiled
#                                               # with the candidate junction kernels, compiled with Inductor's
#                                               # kernel tuning, eager, and eager with the kernels, all but plain
#                                               # eager profiled, today's package only (gpu_train_headline.*);
#   bash benchmarks/gpu_visit.sh kernel         # ~7 minutes, then the junction alone as long as the call lasts:
#                                               # base's compiled step as the trainer runs it, with the junctions
#                                               # through the candidate kernels, attention through SDPA's
#                                               # memory-efficient kernel first and the feed-forward ReLU in its
#                                               # product's epilogue (linear_relu.py), the same replayed as CUDA
#                                               # graphs (the host may bound a step whose kernels take less), the
#                                               # same without the epilogue, attention alone,
#                                               # profiled, in one run (gpu_train_kernel.*), then the junction
#                                               # through the kernels compiled and eager, compiled, tuned
#                                               # (gpu_layernorm.*), both logs to $OUT;
#   bash benchmarks/gpu_visit.sh kernel-big     # ~6 minutes: big's step with the three changes, compiled and as CUDA
#                                               # graphs, profiled (gpu_train_kernel_big.*), read against the
#                                               # 2026-12-04 visit's 79.5 and 79.1 ms (the package unchanged since).
#                                               # Both fit one 15-minute session: kernel with timeout_s 450, then
#                                               # kernel-big at once
#   bash benchmarks/gpu_visit.sh curve          # ~4 minutes: issue 47's loss-curve check for the candidates, in one
#                                               # run (gpu_train_curve_candidates.*): base's 200-step curve in bf16
#                                               # (this package's path), the same run with its dropout masks drawn
#                                               # again (the floor for kernels that draw their own), then compiled,
#                                               # and compiled with the junction kernels, the memory-efficient
#                                               # attention and the ReLU epilogue; then what a batch of a shape
#                                               # never met costs per attention kernel (cuDNN's builds an execution
#                                               # plan for each new shape: a corpus's thousands of shapes, not these
#                                               # rows' three); after a kernel visit that finds them faster
#   bash benchmarks/gpu_visit.sh headline-big   # then big's junction and rows (gpu_train_headline_big.*). The
#                                               # 2026-12-04 visit ran base's and big's compiled and CUDA-graph rows
#                                               # and the loss kernel in 349 s, the machine's start and transfers
#                                               # ~30 s; the tuned rows compile for longer
# Results land in benchmarks/results/ and, with $OUT set, are copied there as each script ends; each
# script's whole output is written to $OUT as it runs (NAME.log), so a visit cut off by its time limit
# still brings back every row printed so far. Their commit fields come from the device's git metadata,
# which can be stale: set them by hand after copying back. $OUT/inductor.tgz holds the call's compile caches
# (below).
set -eu
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 TRANSFORMER_DATA=$PWD/runs/gpu/data
export PYTHONPATH=$PWD:$PWD/runs/gpu/site${PYTHONPATH:+:$PYTHONPATH}
case "${1:-}" in decode|train-base|train-big|headline|headline-big|kernel|kernel-big|curve) ;;
  *) echo "usage: bash benchmarks/gpu_visit.sh" \
       "decode|train-base|train-big|headline|headline-big|kernel|kernel-big|curve" >&2
     exit 2 ;;
esac
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
R=benchmarks/results
LOGS=${OUT:-/tmp}
# torch.compile's caches (benchmarks/compile_cache.sh) in a folder of the machine's own, which a warm machine keeps
# between calls: a fresh one starts it from the carried runs/gpu/inductor.tgz, the last visit's. Packed into
# $OUT/inductor.tgz each minute and after each script, so a call cut by its limit brings back what it compiled
# and tuned; `CACHE=<its fetched path> bash benchmarks/gpu_prepare.sh` makes it the next call's
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor
export TRITON_CACHE_DIR=$TORCHINDUCTOR_CACHE_DIR/triton  # the package's own kernels (the loss) too
if [ ! -d "$TORCHINDUCTOR_CACHE_DIR" ] && [ -f runs/gpu/inductor.tgz ]; then
  bash benchmarks/compile_cache.sh unpack runs/gpu/inductor.tgz "$TORCHINDUCTOR_CACHE_DIR" || true
fi
pack() { if [ -n "${OUT:-}" ]; then bash benchmarks/compile_cache.sh pack "$TORCHINDUCTOR_CACHE_DIR" "$OUT/inductor.tgz" || true; fi; }
if [ -n "${OUT:-}" ]; then
  (while sleep 60; do pack; done) &
  trap 'kill $! 2>/dev/null; pack' EXIT
fi

# step NAME TAIL SCRIPT ARGS...: runs benchmarks/SCRIPT, its output logged as it comes (into $LOG_DIR, default
# $LOGS), the last TAIL lines shown; then its result files (NAME.json / NAME.md) copied to $OUT. A step that
# fails says so and the visit goes on to the next: the minutes are spent either way
step() {
  local name=$1 tail=$2 script=$3
  shift 3
  rm -f "$R/$name.json" "$R/$name.md"  # the committed ones: never brought back as if measured now
  python "benchmarks/$script" "$@" 2>&1 | tee "${LOG_DIR:-$LOGS}/$name.log" | tail -"$tail" \
    || echo "gpu_visit: $script failed; its output: ${LOG_DIR:-$LOGS}/$name.log"
  if [ -n "${OUT:-}" ]; then cp "$R/$name.json" "$R/$name.md" "$OUT"/ || true; fi
  pack
}

set -o pipefail
case "$1" in
  decode)
    LOG_DIR=/tmp step compile_step_cuda 5 compile_step.py --device cuda --run runs/gpu/quick --steps 300
    step gpu_decode 12 gpu_decode.py --before runs/gpu/before --device cuda --runs quick=runs/gpu/quick \
      --batches 1 64 512
    LOG_DIR=/tmp step bf16_decode_cuda 12 bf16_decode.py --device cuda --run runs/gpu/quick ;;
  kernel|kernel-big)
    # the rows most wanted first: a call cut by its limit still brings back those its log printed
    ROWS=bf16+compile+kernel+efficient+epilogue,bf16+cudagraphs+kernel+efficient+epilogue
    if [ "$1" = kernel ]; then
      # then the rows without the epilogue (its own gain; and, were it to fail to compile, the others' still)
      ROWS=bf16+compile,$ROWS,bf16+compile+kernel+efficient,bf16+compile+efficient
      step gpu_train_kernel 12 gpu.py --models base --modes $ROWS --profile $ROWS --steps 20 --accumulate 1 \
        --curve 0 --first-shape 0 --name gpu_train_kernel
      step gpu_layernorm 12 gpu_layernorm.py --models base --ways compiled+kernel,kernel,compiled,compiled+tuned
    else
      step gpu_train_kernel_big 12 gpu.py --models big --modes $ROWS --profile $ROWS --steps 20 --accumulate 1 \
        --curve 0 --first-shape 0 --name gpu_train_kernel_big
    fi ;;
  curve)
    step gpu_train_curve_candidates 12 gpu.py --models base --modes bf16 --profile '' --steps 5 --accumulate 1 \
      --first-shape 8 --curve 200 --curve-modes bf16+compile,bf16+compile+kernel+efficient+epilogue \
      --name gpu_train_curve_candidates ;;
  headline|headline-big)
    HEADLINE=(--modes bf16+compile,bf16+compile+kernel,bf16+tuned,bf16,bf16+kernel
              --profile bf16+compile,bf16+compile+kernel,bf16+tuned,bf16+kernel --steps 20 --accumulate 1 --curve 0
              --first-shape 0)
    if [ "$1" = headline ]; then
      LOG_DIR=/tmp step gpu_layernorm 12 gpu_layernorm.py --models base
      LOG_DIR=/tmp step gpu_attention 2 gpu_attention.py
      step gpu_train_headline 20 gpu.py --models base "${HEADLINE[@]}" --name gpu_train_headline
    else
      LOG_DIR=/tmp step gpu_layernorm 12 gpu_layernorm.py --models big
      step gpu_train_headline_big 20 gpu.py --models big "${HEADLINE[@]}" --name gpu_train_headline_big
    fi ;;
  train-base)
    step gpu_train 30 gpu.py --before runs/gpu/before47 --models base --modes bf16,bf16+compile,bf16+cudagraphs \
      --steps 20 ;;
  train-big)
    step gpu_train_big 20 gpu.py --before runs/gpu/before47 --models big --modes bf16,bf16+compile,bf16+cudagraphs \
      --steps 20 --accumulate 1 --curve 0 --first-shape 0 --name gpu_train_big
    LOG_DIR=/tmp step gpu_attention 2 gpu_attention.py
    LOG_DIR=/tmp step fused_loss 4 fused_loss.py ;;
esac
