#!/usr/bin/python3
"""The floor tiler is measured against: the pure batched forward of N windows of a TorchScript model in
Python, on the same LibTorch (python3-torch; on a GPU machine, its PyTorch), warmed up, with glibc's mmap and
trim thresholds raised as tiler raises them, under autocast for fp16/bf16 as tiler runs them. Prints one JSON
line. Used by scripts/bench.sh (pipeline) when python3-torch is installed."""
import argparse
import contextlib
import json
import os
import sys
import time

if "MALLOC_MMAP_THRESHOLD_" not in os.environ:  # glibc reads these at start: re-exec with them set
    os.environ["MALLOC_MMAP_THRESHOLD_"] = str(256 << 20)
    os.environ["MALLOC_TRIM_THRESHOLD_"] = str(1 << 30)
    os.execv(sys.executable, [sys.executable] + sys.argv)

import torch  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("-m", "--model", required=True)
parser.add_argument("--windows", type=int, default=441)
parser.add_argument("--window", type=int, default=256)
parser.add_argument("--batch_size", type=int, default=8)
parser.add_argument("--threads", type=int, default=2)
parser.add_argument("--device", default="cpu")
parser.add_argument("--precision", choices=["fp32", "fp16", "bf16"], default="fp32")  # as tiler: autocast
parser.add_argument("--optimize", action="store_true", help="freeze + optimize_for_inference, as --jit_optimize")
args = parser.parse_args()

torch.set_num_threads(args.threads)
device = torch.device(args.device)
model = torch.jit.load(args.model, map_location=device).eval()
if args.optimize:
    model = torch.jit.optimize_for_inference(torch.jit.freeze(model))
torch.manual_seed(0)
batches = []
left = args.windows
while left > 0:
    b = min(args.batch_size, left)
    batches.append(torch.rand(b, 3, args.window, args.window, device=device))
    left -= b
autocast = contextlib.nullcontext()
if args.precision != "fp32":
    autocast = torch.autocast(device.type, dtype=torch.bfloat16 if args.precision == "bf16" else torch.float16)


def sync():
    if device.type == "cuda":
        torch.cuda.synchronize(device)


with torch.inference_mode(), autocast:
    for _ in range(3):  # warm-up: the profiling executor specialises on the first runs
        model(batches[0])
    sync()
    t0 = time.perf_counter()
    for x in batches:
        model(x)
    sync()
    seconds = time.perf_counter() - t0
print(json.dumps({"windows": args.windows, "seconds": seconds, "windows_per_second": args.windows / seconds,
                  "threads": torch.get_num_threads(), "device": str(device), "precision": args.precision,
                  "optimized": args.optimize, "torch": torch.__version__}))
