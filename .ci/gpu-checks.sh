#!/usr/bin/env bash
# gpu-checks.sh OUT STAGE: what a GPU machine checks of towers (issues 33 and 39), each step
# bounded in time (`timeout`), each log in OUT/STEP.log, a line a step in OUT/summary, written as
# the step ends, so that a call cut short leaves what ran. Run from the project root after
# ../shared/gpu's setup (its README), one stage a call, right after the setup's call. A lease is
# 15 minutes: its start and the six transfer calls take ~2, so each stage's limits sum to under
# 540 s (a step past its limit gets SIGTERM, then SIGKILL 5 s later). In this order:
#   lease   (first lease) what runs on the GPU, in order of priority, each step saying what it
#           proves, with the figures a person reads (no test asserts a speed) below its line:
#             devices         60  the GPU and 2 logical GPUs seen; the probe's bf16/fp32 ratio
#             train-2-towers  70  mnist_convnet trains to ~97% on 2 logical GPUs of one GPU
#             check-4         40  4 towers on logical GPUs equal one device (TF32 off)
#             gpu-tests      120  the gpu-marked tests, 4 workers sharing the GPU
#             rn50-bench      75  ResNet-50 images/sec in fp32 (TF32) and bf16, and their ratio
#             rn50-xla-bf16   50  the same bf16 row under XLA
#             rn50-train-bf16 45  train's own after-warm-up figure (50 timed steps)
#             rn50-torch      40  PyTorch's ResNet-50 on the same GPU, the peer for speed
#                            500
#   suite   (second lease) the rest of the suite, -m 'not gpu', 14 workers: 500 s
#   bench   (a third lease, when wanted) what op determinism costs: ResNet-50 and mnist_convnet
#           in fp32 and bf16, with and without --deterministic (one GPU): 4 x 125 s
set -u
usage='usage: gpu-checks.sh OUT lease|suite|bench'
out=${1:?$usage}
stage=${2:?$usage}
mkdir -p "$out"
# Every step's processes share the GPU (pytest's workers, the towers runs they start): each takes
# the memory it uses. TensorFlow 2.21 has no sm_90 binaries: the driver compiles each kernel from
# PTX at its first use, and keeps it in CUDA_CACHE_PATH for the later steps of this lease. A step
# cut short keeps the lines its Python printed (unbuffered).
export TF_CPP_MIN_LOG_LEVEL=2 TF_FORCE_GPU_ALLOW_GROWTH=true PYTHONUNBUFFERED=1 \
  CUDA_CACHE_PATH=/tmp/cuda-cache CUDA_CACHE_MAXSIZE=4294967296
summary="$out/summary"
: > "$summary"

step() {  # step NAME SECONDS COMMAND...: run it, its output in OUT/NAME.log, a line in summary
  local name=$1 limit=$2 start status
  shift 2
  start=$(date +%s)
  timeout -k 5 "$limit" "$@" > "$out/$name.log" 2>&1
  status=$?
  printf '%-28s status %3d  %4ds  %s\n' "$name" "$status" "$(( $(date +%s) - start ))" \
    "$(grep -v '^$' "$out/$name.log" | tail -n 1 | cut -c1-150)" >> "$summary"
}

show() {  # show NAME REGEX: the lines of OUT/NAME.log that match, under its line in summary
  grep -E "$2" "$out/$1.log" | cut -c1-200 | sed 's/^/    /' >> "$summary"
}

rn50=(towers bench --model resnet50 --towers 1 --batch-size 128 --warmup 5 --window 20)
case $stage in
  lease)
    step devices 60 towers devices --towers 2
    show devices '^(TensorFlow |visible GPUs|tower_|/gpu:|bf16 on|fp16 on)'
    step train-2-towers 70 towers train --towers 2
    show train-2-towers '^(training |logical GPUs|trained to step|test: )'
    step check-4 40 towers check --towers 4
    show check-4 '^(check: |within tolerance)'
    step gpu-tests 120 python3 -m pytest -q -m gpu -n 4 -p no:cacheprovider tests
    step rn50-bench 75 "${rn50[@]}" --precision fp32,bf16
    show rn50-bench '^(bf16 on|synthetic )'
    step rn50-xla-bf16 50 "${rn50[@]}" --precision bf16 --xla
    show rn50-xla-bf16 '^synthetic '
    step rn50-train-bf16 45 towers train --model resnet50 --dataset imagenet-synthetic \
      --steps 60 --batch-size 128 --precision bf16 --log-every 20 --quiet
    show rn50-train-bf16 '^trained to step'
    # Four rows (fp32 and bf16, channels_last and NCHW), 8 warm-up and 30 timed steps each.
    step rn50-torch 40 python3 .gpu/kit/torch_resnet50.py
    show rn50-torch '^torch' ;;
  suite)
    step suite 500 python3 -m pytest -q -n 14 -p no:cacheprovider -m 'not gpu' tests ;;
  bench)
    for model in resnet50 mnist_convnet; do
      step "bench-$model" 125 towers bench --model "$model" --towers 1 --param-device gpu \
        --warmup 5 --window 20 --precision fp32,bf16
      step "bench-$model-deterministic" 125 towers bench --model "$model" --towers 1 \
        --param-device gpu --warmup 5 --window 20 --precision fp32,bf16 --deterministic
    done ;;
  *) echo "gpu-checks.sh: unknown stage $stage: lease, suite or bench" >&2
     exit 2 ;;
esac
cat "$summary"
