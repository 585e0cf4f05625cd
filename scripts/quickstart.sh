#!/usr/bin/env bash
# The main job on a fresh machine: install, train a quick Multi30k EN→DE model (≤ 15 minutes on
# 2 CPU cores), translate a few sentences, and print BLEU on test2016.
set -euo pipefail
# a relative TRANSFORMER_DATA names a folder from where the command was run, not from the checkout
if [ -d "${TRANSFORMER_DATA:-}" ]; then export TRANSFORMER_DATA="$(cd "$TRANSFORMER_DATA" && pwd)"; fi
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ -z "${TRANSFORMER_DATA:-}" ] && [ -d ../shared/data ]; then
  export TRANSFORMER_DATA="$(cd ../shared/data && pwd)"
fi
RUN=${RUN:-runs/quickstart}
T=.venv/bin/transformer
if [ -d "$RUN/checkpoints" ]; then RESUME=--resume; else RESUME=; fi
$T train configs/multi30k_en_de_quick.toml --out "$RUN" $RESUME
printf '%s\n' "A man in an orange hat starring at something." \
              "Two dogs are playing in the snow." \
              "A little girl is sitting on a bench with her mother." |
  $T translate "$RUN" --beam 4
$T evaluate "$RUN" --src multi30k/test_2016_flickr.en.gz --ref multi30k/test_2016_flickr.de.gz \
  --tok-ref multi30k/tok/test_2016_flickr.lc.norm.tok.de.gz --lang de --json "$RUN/test2016.json"
