#!/usr/bin/env bash
# The checks that need an NVIDIA GPU (CI has none), on a CUDA build: scripts/gpu-check.sh [BUILD_DIR]
# On the bundled 4096 px sample: CUDA is used and fp16 is the default there; ranks sharing one GPU (gloo) and
# one rank over NCCL give the labels of one rank; NCCL with two ranks on one GPU is refused clearly; a real
# CUDA out-of-memory (225 GB of activations asked for at once) is retried in halves and changes nothing;
# finetune trains on the GPU and its model runs. Prints ok/FAIL per check; exits 1 if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
bin=$(realpath "${1:-build}")
out=${GPU_CHECK_OUT:-/tmp/tiler-gpu-check}
rm -rf "$out" && mkdir -p "$out"
sample=samples/images/blobs_4096.tif
fails=0
check() {
  local name=$1
  shift
  if "$@"; then echo "ok   $name"; else
    echo "FAIL $name"
    fails=$((fails + 1))
  fi
}
infer() {  # infer NAME LAUNCH... : the sample through tiler, uncompressed outputs in $out/NAME
  local name=$1
  shift
  "$@" -i "$sample" -o "$out/$name" --save labels,probs --compression none --no_progress >"$out/$name.log" 2>&1
}
same_labels() { cmp -s "$out/$1/blobs_4096_labels.tif" "$out/$2/blobs_4096_labels.tif"; }
in_log() { grep -q -- "$2" "$out/$1.log"; }
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)

check "tiler sees CUDA" sh -c "'$bin/tiler' --version | grep -q 'CUDA usable: yes'"
defaults_are_cuda_fp16() {
  "$bin/tiler" -i "$sample" -o "$out/auto" --no_progress >"$out/auto.log" 2>&1 &&
    tr -d ' \n' <"$out/auto/report.json" | grep -q '"device":"cuda:0".*"precision":"fp16"'
}
check "default flags: cuda:0, fp16" defaults_are_cuda_fp16
check "1 rank on cuda" infer one "$bin/tiler" --device cuda
check "2 ranks sharing the GPU (gloo)" infer two "$bin/ctrun" --nproc_per_node 2 "$bin/tiler" --device cuda &&
  check "  same labels as 1 rank" same_labels one two
check "1 rank over NCCL" infer nccl "$bin/ctrun" --nproc_per_node 1 "$bin/tiler" --device cuda --backend nccl &&
  check "  same labels as 1 rank" same_labels one nccl
if [ "$gpus" -eq 1 ]; then
  infer nccl2 "$bin/ctrun" --nproc_per_node 2 "$bin/tiler" --device cuda --backend nccl
  check "NCCL with 2 ranks on 1 GPU: refused, exit 1" test $? -eq 1
  check "  says why" in_log nccl2 "NCCL refuses two ranks on one device"
fi
# 169 windows of 2048 px in one fp32 batch of the sample UNet need far more than one GPU holds.
big="$out/big8192.tif"
"$bin/tiler_bench" make "$big" --size 8192 >/dev/null
for b in 256 8; do
  "$bin/tiler" -i "$big" -o "$out/oom$b" --device cuda --precision fp32 --window 2048 --overlap 0.75 --batch_size $b \
    --save labels,probs --compression none --no_progress >"$out/oom$b.log" 2>&1
  check "batch $b of 2048 px windows, fp32" test $? -eq 0
done
check "  out of memory retried in halves" in_log oom256 "out of memory in a forward of 256 windows: retrying in halves"
check "  the same outputs as batches of 8" sh -c "cmp -s '$out/oom256/big8192_labels.tif' '$out/oom8/big8192_labels.tif' &&
  cmp -s '$out/oom256/big8192_probs.tif' '$out/oom8/big8192_probs.tif'"
check "finetune on cuda" sh -c "'$bin/tiler' finetune --images samples/train/images --labels samples/train/labels \
  --device cuda --epochs 2 -o '$out/ft.pt' --report '$out/ft.json' --no_progress >'$out/ft.log' 2>&1"
check "  its model runs" sh -c "'$bin/tiler' -i $sample -m '$out/ft.pt' -o '$out/ftinfer' --no_progress >/dev/null 2>&1"
echo "$fails check(s) failed; logs and outputs in $out"
[ $fails -eq 0 ]
