#!/usr/bin/env bash
# Makes samples/models/sample.pt: the fixed-seed init.pt fine-tuned on samples/train with tiler itself.
# (samples/make_samples.py makes init.pt and the images; this needs only a build.)
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --build build --target tiler ctrun >/dev/null
./build/ctrun --nproc_per_node 2 ./build/tiler finetune \
  --images samples/train/images --labels samples/train/labels -m samples/models/init.pt \
  -o samples/models/sample.pt --report samples/models/sample.report.json \
  --epochs 8 --lr 2e-3 --schedule cosine --window 128 --batch_size 4 --augment --seed 0 --threads 1
