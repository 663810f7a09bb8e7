#!/usr/bin/python3
"""tiler.predict against MONAI's sliding_window_inference in the same process, on the same TorchScript model,
image and grid. MONAI is no Debian package, so its algorithm is written out here in plain PyTorch as MONAI 1.x
runs it (monai/inferers/utils.py, sliding_window_inference with mode="gaussian", sigma_scale=0.125,
padding_mode="constant", cval=0): MONAI's grid (interval int(roi x (1 - overlap)), the last window shifted back
to end at the edge), sw_batch_size windows a forward, each prediction times the gaussian importance map
(exp(-x^2 / 2 sigma^2) per axis, sigma = 0.125 x roi, clamped below at its smallest value) added into a float32
output and weight map, then divided. Both sides run --threads intra-op threads, fp32, on a uint8 RGB image
scaled by 1/255. Prints one JSON line: seconds of each (the best of --runs), their ratio, the largest
difference of the outputs. Used by scripts/bench.sh python."""
import argparse
import json
import math
import sys
import time

import numpy as np
import torch

parser = argparse.ArgumentParser()
parser.add_argument("--module_dir", required=True, help="where tiler's module is (build/python)")
parser.add_argument("-m", "--model", required=True)
parser.add_argument("--size", type=int, default=4096)
parser.add_argument("--window", type=int, default=256)
parser.add_argument("--overlap", type=float, default=0.25)
parser.add_argument("--batch_size", type=int, default=8)
parser.add_argument("--threads", type=int, default=2)
parser.add_argument("--runs", type=int, default=1)
args = parser.parse_args()
sys.path.insert(0, args.module_dir)
import tiler  # noqa: E402

torch.set_num_threads(args.threads)


def image(size):
    """A deterministic RGB uint8 image: smooth blobs on a textured background."""
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    out = 40 + 20 * np.sin(yy / 17.0) * np.cos(xx / 23.0)
    for _ in range(size * size // 20000):
        cy, cx, r = rng.uniform(0, size), rng.uniform(0, size), rng.uniform(6, 24)
        y0, y1, x0, x1 = int(max(cy - r, 0)), int(min(cy + r + 1, size)), int(max(cx - r, 0)), int(min(cx + r + 1, size))
        d = np.hypot(yy[y0:y1, x0:x1] - cy, xx[y0:y1, x0:x1] - cx)
        out[y0:y1, x0:x1] = np.maximum(out[y0:y1, x0:x1], np.where(d < r, 200 - 60 * d / r, 0))
    rgb = np.stack([out, out * 0.85, out * 0.7], axis=-1)
    return np.clip(rgb, 0, 255).astype(np.uint8)


def starts(size, roi, overlap):
    if roi >= size:
        return [0]
    interval = max(int(roi * (1 - overlap)), 1)
    count = math.ceil((size - roi) / interval) + 1
    return [min(i * interval, size - roi) for i in range(count)]


def gaussian(roi, sigma_scale=0.125):
    axis = []
    for n in roi:
        x = torch.arange(n, dtype=torch.float64) - (n - 1) / 2.0
        axis.append(torch.exp(-x * x / (2 * (sigma_scale * n) ** 2)))
    g = (axis[0][:, None] * axis[1][None, :]).to(torch.float32)
    return torch.clamp(g, min=max(float(g.min()), 1e-3))


@torch.inference_mode()
def sliding_window_inference(inputs, roi, sw_batch_size, predictor, overlap):
    _, _, h, w = inputs.shape
    ys, xs = starts(h, roi[0], overlap), starts(w, roi[1], overlap)
    slices = [(y, x) for y in ys for x in xs]
    importance = gaussian(roi)
    output = weights = None
    for b in range(0, len(slices), sw_batch_size):
        batch = slices[b:b + sw_batch_size]
        windows = torch.cat([inputs[:, :, y:y + roi[0], x:x + roi[1]] for y, x in batch])
        preds = predictor(windows)
        if output is None:
            output = torch.zeros((1, preds.shape[1], h, w), dtype=torch.float32)
            weights = torch.zeros((1, 1, h, w), dtype=torch.float32)
        for k, (y, x) in enumerate(batch):
            output[0, :, y:y + roi[0], x:x + roi[1]] += preds[k] * importance
            weights[0, 0, y:y + roi[0], x:x + roi[1]] += importance
    return output / weights


pixels = image(args.size)
model = torch.jit.load(args.model).eval()
flags = dict(window=args.window, overlap=args.overlap, batch_size=args.batch_size, threads=args.threads,
             replicas=1, save="probs")
tiler.predict(pixels[:512, :512], args.model, **flags)  # warm: LibTorch's first kernels, the file cache
x = torch.from_numpy(pixels).permute(2, 0, 1)[None].float() / 255.0
with torch.inference_mode():
    model(x[:, :, : args.window, : args.window])
best = {"tiler": math.inf, "monai": math.inf}
for _ in range(args.runs):
    t0 = time.monotonic()
    ours = tiler.predict(pixels, args.model, **flags)["probs"]
    best["tiler"] = min(best["tiler"], time.monotonic() - t0)
    t0 = time.monotonic()
    theirs = sliding_window_inference(x, (args.window, args.window), args.batch_size, model, args.overlap)[0]
    best["monai"] = min(best["monai"], time.monotonic() - t0)
difference = float(np.max(np.abs(ours - theirs.numpy())))
print(json.dumps({"seconds": best["tiler"], "monai_seconds": best["monai"],
                  "speedup": best["monai"] / best["tiler"], "max_abs_difference": difference,
                  "windows": len(starts(args.size, args.window, args.overlap)) ** 2}))
