#!/usr/bin/env bash
# gpu_check.sh: what a user with GPUs runs to check a machine for towers (a few minutes).
#
# Runs, on this machine's GPUs: towers devices; check (N towers against one device, exact:
# TF32 off, op determinism on); bench in fp32, bf16 and fp16; training with replicated
# variables (NCCL); explain (one real step: where each op ran, the placement audit); and a
# 2-worker collective job on this host's GPUs (towers launch splits them, or shares one).
# Two towers on a one-GPU machine run on two logical GPUs of it. Prints one table, a row per
# check, and exits 1 if any failed.
#
# Written for GPUs and not run by the project: no GPU with TensorFlow was at hand (the
# GPU paths are checked there with `towers explain --plan-only` instead). On a machine
# where TensorFlow sees no GPU it says why, in one line, and exits 1.
set -uo pipefail

# One process asks TensorFlow: /gpu:0 exists, or the last line says why not.
if ! first=$(towers devices --devices /gpu:0 2>&1); then
  echo "gpu_check: $(printf '%s\n' "$first" | tail -n 1 | sed 's/^towers: error: //')"
  exit 1
fi
towers=2  # two logical GPUs of one GPU where there is one
rows=() failed=0

run() {  # run NAME COMMAND...: one row of the table
  local name=$1 start status out
  shift
  start=$(date +%s)
  if out=$("$@" 2>&1); then status=ok; else status=FAILED; failed=1; fi
  rows+=("$(printf '%-40s %-7s %5ss  %s' "$name" "$status" "$(( $(date +%s) - start ))" \
    "$(printf '%s\n' "$out" | grep -v '^$' | tail -n 1 | cut -c1-100)")")
}

run "devices" towers devices
run "check: $towers towers = 1 device" towers check --towers "$towers" --model mnist_convnet
run "bench: fp32, bf16, fp16" towers bench --towers "1,$towers" --precision fp32,bf16,fp16 \
  --warmup 5 --window 20
run "train: replicated (NCCL/shared sum)" towers train --towers "$towers" --variable-update replicated \
  --steps 100 --quiet --eval-every 0
run "explain: one real step" towers explain --towers "$towers" --variable-update replicated
run "launch: 2 collective workers" towers launch --workers 2 -- train --cluster-mode \
  collective --steps 50 --quiet --eval-every 0

printf '%-40s %-7s %6s  %s\n' check status time 'last line'
printf '%s\n' "${rows[@]}"
exit "$failed"
