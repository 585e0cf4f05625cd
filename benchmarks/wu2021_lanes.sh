#!/usr/bin/env bash
# benchmarks/wu2021.py's runs as parallel lanes on one GPU machine, then its report:
#   NAMES="wu_ls0.1_lctok wu_ls0.1_lctok_seed2" bash benchmarks/wu2021_lanes.sh DEADLINE [REPORT_UNTIL]
# Each named run trains in its own process (--threads 1) under CUDA MPS where it can be started: one
# process of this 2.6M-parameter model is Python-bound (~27 updates/s on an H100), eight shared one H100
# at ~17 updates/s each. Lanes still training DEADLINE seconds after the start get SIGTERM (checkpoint
# written; a later call resumes them); the report runs until REPORT_UNTIL (default DEADLINE + 60). With
# $OUT set, the result files and the runs' logs are packed into $OUT/wu.tgz. Needs $TRANSFORMER_DATA.
set -u
DEADLINE=${1:-520}; REPORT_UNTIL=${2:-$((DEADLINE + 60))}; T0=$(date +%s)
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/benchmarks${PYTHONPATH:+:$PYTHONPATH}
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mpslog
mkdir -p /tmp/mps /tmp/mpslog runs/wulogs
nvidia-cuda-mps-control -d 2>/dev/null && echo "MPS on" || { echo "MPS off"; unset CUDA_MPS_PIPE_DIRECTORY; }
NAMES=${NAMES:-$(python3 -c "import wu2021; print(' '.join(wu2021.RUNS))")}
SEL=benchmarks/results/selection/multi30k_en_de_wu2021
declare -A PID
for n in $NAMES; do
  [ -f $SEL/$n.json ] && continue
  python3 benchmarks/wu2021.py --only $n --threads 1 >>runs/wulogs/$n.log 2>&1 & PID[$n]=$!
done
while [ ${#PID[@]} -gt 0 ]; do
  sleep 20; now=$(( $(date +%s) - T0 )); alive=0
  for n in "${!PID[@]}"; do kill -0 ${PID[$n]} 2>/dev/null && alive=$((alive+1)); done
  echo "t=$now alive=$alive $(for n in $NAMES; do printf '%s:%s ' $n "$(grep -o 'step=[0-9]*' runs/wu2021/$n/train.log 2>/dev/null | tail -1)"; done)"
  [ $alive = 0 ] && break
  if [ $now -ge $DEADLINE ]; then
    for n in "${!PID[@]}"; do kill -TERM ${PID[$n]} 2>/dev/null; done; sleep 25; break
  fi
done
left=$(( REPORT_UNTIL - ($(date +%s) - T0) ))
[ $left -gt 20 ] && timeout $left python3 benchmarks/wu2021.py 2>&1 | grep -v "^train" | tail -40
if [ -n "${OUT:-}" ]; then
  tar czf $OUT/wu.tgz $SEL benchmarks/results/multi30k_en_de_wu2021.* runs/wulogs runs/wu2021/*/train.log \
    runs/wu2021/*/metrics.jsonl runs/wu2021/*/summary.json runs/wu2021/*/*.hyp 2>/dev/null
fi
