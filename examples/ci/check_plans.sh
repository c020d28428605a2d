#!/usr/bin/env bash
# CI job: fail when a committed example plan has drifted from what mlopt makes of examples/ now.
#
#   bash examples/ci/check_plans.sh            # check (with --resolve: re-plan and compare the bytes)
#   bash examples/ci/check_plans.sh --fast     # check hashes and options only (no re-plan)
#   bash examples/ci/check_plans.sh --write    # regenerate the committed plans (after an intended change)
#
# Exit 0: every plan current; 1: some plan stale (each stale line names the input, option or JSON path);
# 2: bad input. Environment: EXAMPLES=DIR checks a copy of examples/ (default: the folder above this script),
# MLOPT and PYTHON name the commands to run (default: mlopt, else python -m mlopt.cli; python).
# The inputs are regenerated on every run (README's command 1 trace of examples/ddp_mlp and the CNN trace of
# examples/schedule/models.py), so a change in the importer or the model generator is drift too. The commands
# below are the ones that made examples/ci/plans/ (docs/plan-check.md).
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
examples="${EXAMPLES:-$(dirname "$here")}"
python="${PYTHON:-python}"
if [ -n "${MLOPT:-}" ]; then mlopt="$MLOPT"
elif command -v mlopt >/dev/null 2>&1; then mlopt="mlopt"
else mlopt="$python -m mlopt.cli"; fi

mode="${1:---resolve}"
case "$mode" in
  --resolve|--fast|--write) ;;
  *) echo "usage: $0 [--resolve|--fast|--write]" >&2; exit 2 ;;
esac

plans="$examples/ci/plans"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# Inputs (deterministic: the same bytes on every run).
$mlopt -q trace "$examples/ddp_mlp/rank0.et.json.gz" --kineto "$examples/ddp_mlp/rank0.kineto.json.gz" \
  -o "$tmp/ddp_mlp.trace.json" || exit 2
$python "$examples/schedule/models.py" "$tmp" >/dev/null || exit 2

failed=0
# plan TARGET ARGS...: `mlopt plan ARGS -o TARGET` with --write, else `mlopt plan ARGS --check TARGET [--resolve]`.
plan() {
  local target="$1"; shift
  local args=("$@")
  case "$mode" in
    --write) args+=(-o "$target") ;;
    --fast) args+=(--check "$target") ;;
    --resolve) args+=(--check "$target" --resolve) ;;
  esac
  echo "+ mlopt plan ${args[*]}"
  $mlopt plan "${args[@]}"
  local rc=$?
  if [ "$rc" -eq 1 ]; then failed=1; elif [ "$rc" -ne 0 ]; then exit "$rc"; fi
}

# README's command 1: every planner that applies to the 2-rank DDP example (index.json + 7 plans).
plan "$plans/ddp_mlp" --model "$tmp/ddp_mlp.trace.json" --topology fully-connected:2
# One plan per planner subcommand, with options that keep them small, fast and deterministic.
plan "$plans/ddp_mlp.memory.plan.json" memory --model "$tmp/ddp_mlp.trace.json" --budget-ratio 1.0
plan "$plans/cnn.schedule.plan.json" schedule --model "$tmp/cnn.trace.json" --topology dgx-a100x2 \
  --iterations 1 --max-steps 60
plan "$plans/allgather-ndv2-1MiB.xml" collective --topology ndv2 --collective allgather --size 1MiB \
  --algorithm ring

if [ "$failed" -ne 0 ]; then
  echo "examples/ci: stale plans (regenerate with: bash examples/ci/check_plans.sh --write)" >&2
  exit 1
fi
[ "$mode" = "--write" ] && echo "examples/ci: plans written to $plans" || echo "examples/ci: every plan is current"
