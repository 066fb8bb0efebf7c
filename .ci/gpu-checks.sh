#!/usr/bin/env bash
# gpu-checks.sh OUT STAGE: what a GPU machine checks of towers (issue 33), each step bounded in
# time, each log under OUT, a line a step in OUT/summary. Run from the project root after
# ../shared/gpu's setup (its README), a stage per call (each under the device's 10 minutes):
#   gpu     towers devices, the gpu-marked tests, check --towers 4 (mnist_convnet; resnet20 with
#           --sync-bn, whose figure is read, not judged), train --towers 2
#   bench   what op determinism costs: ResNet-50 and mnist_convnet, fp32 and bf16, with and
#           without --deterministic (one GPU, variables on it)
#   suite   the rest of the suite, 14 workers
#   speed   issue 34: ResNet-50 on one GPU, synthetic, fp32 and bf16: the default (variables on
#           the GPU) at batch 128 and 256, against --param-device cpu, with --xla, in NHWC
#   train   issue 34: train's own after-warm-up figure on imagenet-synthetic (bf16, 200 steps)
#           against bench's row, and PyTorch's (../shared/gpu's torch_resnet50.py) in this call
set -u
out=${1:?usage: gpu-checks.sh OUT gpu|bench|suite|speed|train}
stage=${2:?usage: gpu-checks.sh OUT gpu|bench|suite|speed|train}
mkdir -p "$out"
export TF_CPP_MIN_LOG_LEVEL=2 CUDA_CACHE_MAXSIZE=4294967296
summary="$out/summary"
: > "$summary"

step() {  # step NAME SECONDS COMMAND...: run it, its output in OUT/NAME.log, a line in summary
  local name=$1 limit=$2 start status
  shift 2
  start=$(date +%s)
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  status=$?
  printf '%-28s status %3d  %4ds  %s\n' "$name" "$status" "$(( $(date +%s) - start ))" \
    "$(grep -v '^$' "$out/$name.log" | tail -n 1 | cut -c1-150)" >> "$summary"
}

case $stage in
  gpu)
    step devices 60 towers devices --towers 2
    step gpu-tests 330 python3 -m pytest -q -m gpu -n 4 -p no:cacheprovider tests
    step check-4-mnist 60 towers check --towers 4 --model mnist_convnet
    step check-4-resnet20 60 towers check --towers 4 --model resnet20 --sync-bn --steps 2
    step train-2-towers 60 towers train --towers 2 --epochs 1 --eval-every 0 ;;
  bench)
    for model in resnet50 mnist_convnet; do
      step "bench-$model" 130 towers bench --model "$model" --towers 1 --param-device gpu \
        --warmup 8 --window 30 --precision fp32,bf16
      step "bench-$model-deterministic" 130 towers bench --model "$model" --towers 1 \
        --param-device gpu --warmup 8 --window 30 --precision fp32,bf16 --deterministic
    done ;;
  suite)
    step suite 560 python3 -m pytest -q -n 14 -p no:cacheprovider -m 'not gpu' tests ;;
  speed)
    rn50=(towers bench --model resnet50 --towers 1 --warmup 8 --window 30 --precision fp32,bf16)
    step rn50-128 110 "${rn50[@]}" --batch-size 128
    step rn50-256 130 "${rn50[@]}" --batch-size 256
    step rn50-128-host 110 "${rn50[@]}" --batch-size 128 --param-device cpu
    step rn50-128-nhwc 110 "${rn50[@]}" --batch-size 128 --data-format NHWC
    step rn50-128-xla 160 "${rn50[@]}" --batch-size 128 --xla ;;
  train)
    step rn50-bench-bf16 110 towers bench --model resnet50 --towers 1 --warmup 8 --window 30 \
      --precision bf16 --batch-size 128
    step rn50-train-bf16 200 towers train --model resnet50 --dataset imagenet-synthetic \
      --steps 200 --batch-size 128 --precision bf16 --log-every 50 --quiet
    step rn50-torch 180 python3 .gpu/kit/torch_resnet50.py ;;
  *) echo "gpu-checks.sh: unknown stage $stage: gpu, bench, suite, speed or train" >&2
     exit 2 ;;
esac
cat "$summary"
