#!/usr/bin/env bash
# The checks that need an NVIDIA GPU (CI has none), on a CUDA build: scripts/gpu-check.sh [BUILD_DIR]
# On the bundled 4096 px sample: CUDA is used and fp16 is the default there; ranks sharing one GPU (gloo) and
# one rank over NCCL give the labels of one rank; NCCL with two ranks on one GPU is refused clearly; a real
# CUDA out-of-memory (225 GB of activations asked for at once) is retried in halves and changes nothing;
# finetune trains on the GPU and its model runs; an image owned by rank 1 gathers its windows from rank 0 on CUDA;
# the compression pool writes the bytes of one writer thread; embed and classify on CUDA match the CPU;
# fp16 and bf16 probabilities against fp32 (numbers printed; python3 with numpy, tifffile and h5py there).
# Prints ok/FAIL per check; exits 1 if any failed.
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
check "  blended on the GPU (report: stitch device)" sh -c "tr -d ' \n' <'$out/one/report.json' | grep -q '\"stitch\":\"device\"'"
check "1 rank on cuda, blended on the host" infer host "$bin/tiler" --device cuda --stitch host
check "  the same labels and f32 probabilities" sh -c "cmp -s '$out/one/blobs_4096_labels.tif' '$out/host/blobs_4096_labels.tif' &&
  cmp -s '$out/one/blobs_4096_probs.tif' '$out/host/blobs_4096_probs.tif'"
check "u8 probabilities blended on the GPU" infer u8 "$bin/tiler" --device cuda --probs_dtype u8
check "  and on the host" infer u8host "$bin/tiler" --device cuda --probs_dtype u8 --stitch host
check "  the same bytes" sh -c "cmp -s '$out/u8/blobs_4096_probs.tif' '$out/u8host/blobs_4096_probs.tif'"
check "2 ranks sharing the GPU (gloo)" infer two "$bin/ctrun" --nproc_per_node 2 "$bin/tiler" --device cuda &&
  check "  same labels as 1 rank" same_labels one two
check "1 rank over NCCL" infer nccl "$bin/ctrun" --nproc_per_node 1 "$bin/tiler" --device cuda --backend nccl &&
  check "  same labels as 1 rank" same_labels one nccl
if [ "$gpus" -eq 1 ]; then
  infer nccl2 "$bin/ctrun" --nproc_per_node 2 "$bin/tiler" --device cuda --backend nccl
  check "NCCL with 2 ranks on 1 GPU: refused, exit 1" test $? -eq 1
  check "  says why" in_log nccl2 "NCCL refuses two ranks on one device"
fi
# 169 windows of 2048 px in one fp32 batch of the sample UNet need more than an 80 GB GPU holds (0.5-0.8 GB a
# window). On a larger GPU (an H200's 141 GB hold them all) a second process takes all but 75 GB first.
batch=256
big="$out/big.tif"
"$bin/tiler_bench" make "$big" --size 8192 >/dev/null
hog=""
memory_mb=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
if [ "${memory_mb:-0}" -gt 90000 ]; then
  python3 -c "
import time, torch
free, _ = torch.cuda.mem_get_info()
held = torch.empty(int(free - 75e9), dtype=torch.uint8, device='cuda')
print('holding', held.numel() >> 30, 'GiB', flush=True)
time.sleep(900)" >"$out/hog.log" 2>&1 &
  hog=$!
  for _ in $(seq 120); do grep -q holding "$out/hog.log" && break; sleep 0.5; done
  echo "a second process holds $(sed -n 's/holding //p' "$out/hog.log") of the GPU's $((memory_mb / 1024)) GiB"
fi
for b in $batch 8; do
  "$bin/tiler" -i "$big" -o "$out/oom$b" --device cuda --precision fp32 --window 2048 --overlap 0.75 --batch_size $b \
    --save labels,probs --compression none --no_progress >"$out/oom$b.log" 2>&1
  check "batch $b of 2048 px windows, fp32" test $? -eq 0
done
[ -n "$hog" ] && kill "$hog" && wait "$hog" 2>/dev/null
check "  out of memory retried in halves" in_log oom$batch "out of memory in a forward of [0-9]* windows: retrying in halves"
check "  the same outputs as batches of 8" sh -c "cmp -s '$out/oom$batch/big_labels.tif' '$out/oom8/big_labels.tif' &&
  cmp -s '$out/oom$batch/big_probs.tif' '$out/oom8/big_probs.tif'"
check "finetune on cuda" sh -c "'$bin/tiler' finetune --images samples/train/images --labels samples/train/labels \
  --device cuda --epochs 2 -o '$out/ft.pt' --report '$out/ft.json' --no_progress >'$out/ft.log' 2>&1"
check "  its model runs" sh -c "'$bin/tiler' -i $sample -m '$out/ft.pt' -o '$out/ftinfer' --no_progress >/dev/null 2>&1"

# Two images over two ranks sharing the GPU: rank 1 owns one of them and gathers rank 0's windows of it.
mkdir -p "$out/two_in"
cp "$sample" "$out/two_in/a.tif"
cp "$sample" "$out/two_in/b.tif"
two_images() {  # two_images NAME LAUNCH...
  local name=$1
  shift
  "$@" -i "$out/two_in" -o "$out/$name" --device cuda --save labels --compression none --no_progress \
    >"$out/$name.log" 2>&1
}
check "2 images on 1 rank" two_images own1 "$bin/tiler"
check "2 images on 2 ranks (each owns one)" two_images own2 "$bin/ctrun" --nproc_per_node 2 "$bin/tiler"
check "  the same labels, each image" sh -c "cmp -s '$out/own1/a_labels.tif' '$out/own2/a_labels.tif' &&
  cmp -s '$out/own1/b_labels.tif' '$out/own2/b_labels.tif'"
if [ "$gpus" -ge 2 ]; then
  check "2 images on 2 ranks over NCCL" two_images own_nccl "$bin/ctrun" --nproc_per_node 2 "$bin/tiler" --backend nccl
  check "  the same labels, each image" sh -c "cmp -s '$out/own1/a_labels.tif' '$out/own_nccl/a_labels.tif' &&
    cmp -s '$out/own1/b_labels.tif' '$out/own_nccl/b_labels.tif'"
else
  echo "skip NCCL across GPUs: this machine has $gpus GPU"
fi

# The compression pool (default) against one writer thread: the same deflate bytes.
pool() {  # pool NAME FLAGS...
  local name=$1
  shift
  "$bin/tiler" -i "$sample" -o "$out/$name" --device cuda --save labels,probs --no_progress "$@" >"$out/$name.log" 2>&1
}
check "compression pool (default writer threads)" pool pool_default
check "one writer thread" pool pool_one --write_threads 1
check "  the same bytes" sh -c "cmp -s '$out/pool_default/blobs_4096_probs.tif' '$out/pool_one/blobs_4096_probs.tif' &&
  cmp -s '$out/pool_default/blobs_4096_labels.tif' '$out/pool_one/blobs_4096_labels.tif'"

# Per-window tasks on CUDA against the CPU, both fp32.
per_window() {  # per_window NAME DEVICE MODEL TASK
  "$bin/tiler" -i "$sample" -o "$out/$1" --device "$2" --precision fp32 -m "samples/models/$3" --task "$4" \
    --no_progress >"$out/$1.log" 2>&1
}
check "embed on cuda" per_window embed_cuda cuda encoder.pt embed
check "embed on cpu" per_window embed_cpu cpu encoder.pt embed
check "  features agree (max |diff| < 1e-3 of their scale)" python3 - "$out" <<'PY'
import sys, h5py, numpy as np
o = sys.argv[1]
a = h5py.File(f"{o}/embed_cuda/blobs_4096.h5")["features"][:]
b = h5py.File(f"{o}/embed_cpu/blobs_4096.h5")["features"][:]
d = float(np.abs(a - b).max()); scale = float(np.abs(b).max())
print(f"embed: {a.shape} features, max |cuda - cpu| {d:.3g} (scale {scale:.3g})")
sys.exit(0 if a.shape == b.shape and d <= 1e-3 * max(scale, 1.0) else 1)
PY
# The bundled detector counts erosions: the same boxes on either device, to the byte (scores: below).
check "detect on cuda" per_window detect_cuda cuda detector.pt detect
check "detect on cpu" per_window detect_cpu cpu detector.pt detect
# same_objects A B [SCORE_TOLERANCE]: the two runs' GeoJSON to the byte, or else the same features with scores
# within the tolerance (0: none); prints what differs (counts, the first features apart).
same_objects() {
  cmp -s "$out/$1/blobs_4096_objects.geojson" "$out/$2/blobs_4096_objects.geojson" && return 0
  python3 - "$out/$1/blobs_4096_objects.geojson" "$out/$2/blobs_4096_objects.geojson" "${3:-0}" <<'PY'
import json, sys
a, b = (json.load(open(f))["features"] for f in sys.argv[1:3])
tolerance = float(sys.argv[3])
def score_apart(x, y):
    sx, sy = (f["properties"]["measurements"].pop("score", 0.0) for f in (x, y))
    return abs(sx - sy)
apart = [(x, y) for x, y in zip(a, b) if x != y]
shown = [(json.dumps(x)[:400], json.dumps(y)[:400]) for x, y in apart[:3]]
scores = [score_apart(x, y) for x, y in apart]
other = sum(x != y for x, y in apart)
print(f"objects: {len(a)} against {len(b)}, {len(apart)} of the first {min(len(a), len(b))} differ, "
      f"{other} in more than the score; scores apart by at most {max(scores, default=0):.3g}")
for x, y in shown:
    print("  ", x, "\n   against", y)
sys.exit(0 if len(a) == len(b) and other == 0 and max(scores, default=0) <= tolerance else 1)
PY
}
# The detector's score is a depth over 24: its division on CUDA (fused by TorchScript's GPU fuser) and on
# the CPU differ in the last bit for a third of the boxes (0.7083334 against 0.7083333 on an H200).
check "  the same boxes, scores within 1e-6" same_objects detect_cuda detect_cpu 1e-6
# The bundled instance model compares and spreads whole numbers: the same objects on either device, to the byte.
check "instances on cuda" per_window instances_cuda cuda instances.pt instances
check "instances on cpu" per_window instances_cpu cpu instances.pt instances
check "  the same objects" same_objects instances_cuda instances_cpu
check "classify on cuda" per_window classify_cuda cuda classifier.pt classify
check "classify on cpu" per_window classify_cpu cpu classifier.pt classify
check "  class scores agree (max |diff| < 1e-3)" python3 - "$out" <<'PY'
import csv, sys
o = sys.argv[1]
rows = [list(csv.reader(open(f"{o}/classify_{d}/blobs_4096.csv"))) for d in ("cuda", "cpu")]
head = rows[0][0]
cols = [i for i, h in enumerate(head) if h.startswith("prob_")]
d = max(abs(float(a[i]) - float(b[i])) for a, b in zip(rows[0][1:], rows[1][1:]) for i in cols)
print(f"classify: {len(rows[0]) - 1} windows x {len(cols)} classes, max |cuda - cpu| {d:.3g}")
sys.exit(0 if len(rows[0]) == len(rows[1]) and cols and d <= 1e-3 else 1)
PY

# Half precision against fp32 on CUDA: probabilities and labels of the sample.
for p in fp32 fp16 bf16; do
  "$bin/tiler" -i "$sample" -o "$out/prec_$p" --device cuda --precision "$p" --save labels,probs \
    --compression none --no_progress >"$out/prec_$p.log" 2>&1
  check "precision $p" test $? -eq 0
done
for p in fp16 bf16; do
  check "  $p against fp32 (max |diff| < 0.25, labels agree >= 99.9%)" python3 - "$out" "$p" <<'PY'
import sys, numpy as np, tifffile
o, p = sys.argv[1], sys.argv[2]
ref = tifffile.imread(f"{o}/prec_fp32/blobs_4096_probs.tif").astype(np.float32)
got = tifffile.imread(f"{o}/prec_{p}/blobs_4096_probs.tif").astype(np.float32)
lr = tifffile.imread(f"{o}/prec_fp32/blobs_4096_labels.tif")
lg = tifffile.imread(f"{o}/prec_{p}/blobs_4096_labels.tif")
d = np.abs(ref - got)
agree = float((lr == lg).mean())
print(f"{p} vs fp32: max |diff| {d.max():.4f}, mean {d.mean():.5f}, labels agree {100 * agree:.4f}%")
sys.exit(0 if d.max() < 0.25 and agree >= 0.999 else 1)
PY
done

echo "$fails check(s) failed; logs and outputs in $out"
[ $fails -eq 0 ]
