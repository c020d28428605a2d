#!/usr/bin/env bash
# Trace the example models and plan them for an N-rank DDP job on one host (fully connected ranks).
#
#   bash examples/train_ddp/make_plans.sh [OUT] [RANKS] ["MODELS"]   # defaults: out/train_ddp/plans 4 "mlp cnn"
#
# Writes, per model (mlp, cnn), into OUT/MODEL/:
#   trace.json          mlopt trace of one process's step (forward, loss, backward, SGD), batch 32, seed 0
#   threads.plan.json   LIBRA's fusion groups for RANKS ranks (first pass: they become the DDP buckets)
#   ddp.trace.json      the trace plus one all-reduce per DDP bucket (examples/train_ddp/ddp_trace.py)
#   plans/              `mlopt plan --model ddp.trace.json --topology fully-connected:RANKS`: memory,
#                       collective (one per bucket size), threads, schedule, and plans/index.json
# train.py --plans OUT/MODEL/plans --trace OUT/MODEL/ddp.trace.json applies them.
set -euo pipefail
OUT=${1:-out/train_ddp/plans}
RANKS=${2:-4}
HERE=$(cd "$(dirname "$0")" && pwd)
declare -A SHAPE=([mlp]=256 [cnn]=3,32,32)
for MODEL in ${3:-mlp cnn}; do
  DIR="$OUT/$MODEL"
  mkdir -p "$DIR"
  mlopt trace "$HERE/models.py:$MODEL" --batch 32 --input-shape "${SHAPE[$MODEL]}" --seed 0 -o "$DIR/trace.json"
  mlopt plan threads --model "$DIR/trace.json" --nodes "$RANKS" -o "$DIR/threads.plan.json"
  python "$HERE/ddp_trace.py" "$DIR/trace.json" --buckets "$DIR/threads.plan.json" --world-size "$RANKS" \
    -o "$DIR/ddp.trace.json"
  rm -rf "$DIR/plans"  # only this run's plans in the index folder
  mlopt plan --model "$DIR/ddp.trace.json" --topology "fully-connected:$RANKS" -o "$DIR/plans"
done
