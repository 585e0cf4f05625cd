#!/usr/bin/env bash
# Builds the ignored folder runs/gpu that a GPU visit carries (benchmarks/gpu_visit.sh, wu2021_lanes.sh),
# from a checkout alone, skipping what is already there:
#   before/    979b027's transformer/ package (and configs/): issue 43's decoding "before" (gpu_decode.py --before)
#   before47/  a362aed's: the trainer before issue 47's first change (gpu.py --before)
#   data/      the Multi30k files (from $TRANSFORMER_DATA, default ../shared/data): the machine has no network
#   site/      the pure-Python packages the device's Python lacks (tomli_w, sacremoses)
#   quick/     a model of the quick-start config, step-bounded (QUICK_STEPS updates, default 1,300: about the
#              10 minutes the quick start trains on 2 CPU cores; 0: none), for the decoding measurements
#   inductor.tgz  torch.compile's caches a visit brought back (given as CACHE=PATH, checked; kept otherwise)
#   bash benchmarks/gpu_prepare.sh        # then: run(carry=["runs/gpu"], ...) as gpu_visit.sh says
set -euo pipefail
cd "$(dirname "$0")/.."
G=runs/gpu
mkdir -p "$G"
# each with its configs/ beside it: the package finds its presets there (gpu.py's before process loads "base")
for pair in before:979b027 before47:a362aed; do
  dir=$G/${pair%%:*}
  if [ ! -d "$dir/transformer" ] || [ ! -d "$dir/configs" ]; then
    mkdir -p "$dir" && git archive "${pair##*:}" transformer configs | tar -x -C "$dir"
  fi
done
DATA=${TRANSFORMER_DATA:-../shared/data}
if [ ! -d "$G/data/multi30k" ]; then
  mkdir -p "$G/data" && cp -r "$DATA/multi30k" "$G/data/"
fi
if [ ! -d "$G/site/tomli_w" ]; then
  .venv/bin/pip install --quiet --no-deps --target "$G/site" tomli_w sacremoses
fi
if [ ! -f "$G/quick/summary.json" ] && [ "${QUICK_STEPS:-1300}" != 0 ]; then  # a finished run (an interrupted
  # one is resumed, not measured part-trained); its last checkpoint alone, without Adam's moments and TensorBoard's
  # logs: ten checkpoints with their training state were ~360 MiB, past the 64 MiB a visit carries
  TRANSFORMER_DATA=$PWD/$G/data .venv/bin/transformer train configs/multi30k_en_de_quick.toml --out "$G/quick" \
    --quiet --resume --set train.max_minutes=0 --set "train.max_steps=${QUICK_STEPS:-1300}" --set train.keep_last=1
fi
rm -rf "$G"/quick/checkpoints/*.state.safetensors "$G/quick/tb"
if [ -n "${CACHE:-}" ]; then
  bash benchmarks/compile_cache.sh check "$CACHE" inductor && cp "$CACHE" "$G/inductor.tgz"
fi
du -sh "$G"
carried=$(du -sm "$G" | cut -f1)
if [ "$carried" -gt 56 ]; then  # the device tool carries 64 MiB in all, the working tree included
  echo "error: $G is ${carried} MiB, more than a visit can carry (64 MiB with the working tree): trim it" >&2
  exit 1
fi
