#!/usr/bin/python3
"""The floor tiler finetune is measured against: PyTorch's own training loop (the same LibTorch through
python3-torch) over windows already in memory: each step normalises a uint8 batch (x / 255), runs the
TorchScript model in training mode, cross-entropy, backward and Adam's step, as tiler's step does, minus
tiler's reading, read-ahead and gradient all-reduce. The windows are random bytes and labels of the window
size (a step's cost does not depend on the values). --warmup steps run first, uncounted (8: the steady state;
bench.sh passes 0, as tiler's step_seconds count every step from the first, the TorchScript profiling
executor's first runs included). Prints one JSON line: steps, seconds, steps_per_second.
Used by scripts/bench.sh (finetune)."""
import argparse
import json
import os
import sys
import time

if "MALLOC_MMAP_THRESHOLD_" not in os.environ:  # glibc reads these at start: re-exec with them set
    os.environ["MALLOC_MMAP_THRESHOLD_"] = str(256 << 20)  # as tiler raises them (python_forward.py too)
    os.environ["MALLOC_TRIM_THRESHOLD_"] = str(1 << 30)
    os.execv(sys.executable, [sys.executable] + sys.argv)

import torch  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("-m", "--model", required=True)
parser.add_argument("--steps", type=int, default=72)
parser.add_argument("--window", type=int, default=128)
parser.add_argument("--batch_size", type=int, default=4)
parser.add_argument("--classes", type=int, default=2)
parser.add_argument("--threads", type=int, default=1)
parser.add_argument("--lr", type=float, default=1e-3)
parser.add_argument("--warmup", type=int, default=8)
args = parser.parse_args()

torch.set_num_threads(args.threads)
torch.manual_seed(0)
model = torch.jit.load(args.model)
model.train()
optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
shape = (args.batch_size, 3, args.window, args.window)
batches = [(torch.randint(0, 256, shape, dtype=torch.uint8),
            torch.randint(0, args.classes, (args.batch_size, args.window, args.window)))
           for _ in range(8)]


def step(pixels, labels):
    optimizer.zero_grad()
    out = model(pixels.to(torch.float32).mul_(1.0 / 255.0))
    loss = torch.nn.functional.cross_entropy(out, labels)
    loss.backward()
    optimizer.step()
    return loss.item()


for k in range(args.warmup):  # the profiling executor's first runs
    step(*batches[k % len(batches)])
t0 = time.perf_counter()
for k in range(args.steps):
    step(*batches[k % len(batches)])
seconds = time.perf_counter() - t0
print(json.dumps({"steps": args.steps, "seconds": seconds, "steps_per_second": args.steps / seconds}))
