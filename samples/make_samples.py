#!/usr/bin/env python3
"""Makes tiler's bundled samples, deterministically (fixed seeds).

Images show bright round blobs ("cells") on a smooth textured background; labels mark the blobs exactly.
  samples/images/blobs_4096.tif   4096 x 4096 RGB u8, tiled 256, deflate   (the large-image case)
  samples/images/cells_16bit.tif  1024 x 768 gray u16, striped, LZW         (16-bit input)
  samples/images/small.png        200 x 150 RGB u8                          (smaller than a window)
  samples/train/{images,labels}/train_NN.png  8 pairs of 384 x 384 RGB / u8 class maps {0: background, 1: blob}
  samples/models/init.pt          the untrained fixed-seed UNet (3 -> 2 channels, 16 base channels)
  samples/models/state_dict.pt    a torch.save()'d state_dict: the wrong kind of file, for error tests
  samples/models/encoder.pt       a fixed-seed patch encoder: 3 channels -> 128 features per window ([B, 128]),
                                  four strided convolutions and a global mean (`tiler --task embed`)
  samples/models/classifier.pt    encoder.pt with a linear head: 2 class logits per window (`--task classify`)
  samples/models/detector.pt      bright blobs as boxes, [B, 64, 6] (`--task detect`): no weights, erosions
  samples/models/heads.pt         a tiny fixed-seed HoVerNet-style net (untrained) with three heads, a dict:
                                  np [B, 2, H, W] (2-class segmentation), hv [B, 2, H, W] (a regression map,
                                  run with activation none), tp [B, 3, H, W] (3-class segmentation) (`--heads`)
samples/models/sample.pt is init.pt fine-tuned on samples/train by `tiler finetune` (scripts/make_sample_model.sh).

Needs Debian's python3-torch, python3-numpy, python3-pil and libtiff-tools (tiffcp). Run from the repo root:
  /usr/bin/python3 samples/make_samples.py              (everything)
  /usr/bin/python3 samples/make_samples.py --encoders   (encoder.pt and classifier.pt only)
  /usr/bin/python3 samples/make_samples.py --detector   (detector.pt only)
  /usr/bin/python3 samples/make_samples.py --heads      (heads.pt only)
"""
import os
import subprocess
import sys
import tempfile
from typing import Dict, Tuple

import numpy as np
import torch
from PIL import Image

ROOT = os.path.dirname(os.path.abspath(__file__))


def background(h, w, rng):
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    fx, fy, fd = rng.uniform(25, 60, 3)
    base = 70 + 18 * np.sin(x / fx) * np.cos(y / fy) + 10 * np.sin((x + y) / fd)
    return base


def blobs(h, w, count, rng, rmin=6, rmax=24):
    """Returns (intensity in [0,1], label mask)."""
    inten = np.zeros((h, w), np.float32)
    mask = np.zeros((h, w), np.uint8)
    for _ in range(count):
        cy, cx = rng.uniform(0, h), rng.uniform(0, w)
        r = rng.uniform(rmin, rmax)
        y0, y1 = int(max(cy - r - 2, 0)), int(min(cy + r + 3, h))
        x0, x1 = int(max(cx - r - 2, 0)), int(min(cx + r + 3, w))
        if y1 <= y0 or x1 <= x0:
            continue
        yy, xx = np.mgrid[y0:y1, x0:x1].astype(np.float32)
        d = np.sqrt((yy - cy) ** 2 + (xx - cx) ** 2)
        inside = d <= r
        inten[y0:y1, x0:x1] = np.maximum(inten[y0:y1, x0:x1], np.clip(1.2 - 0.6 * d / r, 0, 1) * inside)
        mask[y0:y1, x0:x1] |= inside.astype(np.uint8)
    return inten, mask


def rgb_image(h, w, count, rng, noise=0.0):
    bg = background(h, w, rng)
    inten, mask = blobs(h, w, count, rng)
    tint = np.array([1.0, 0.85, 0.7], np.float32)
    img = bg[..., None] * tint + inten[..., None] * np.array([150, 140, 120], np.float32)
    if noise > 0:
        img += rng.normal(0, noise, img.shape).astype(np.float32)
    return np.clip(img, 0, 255).astype(np.uint8), mask


def tiff_via_tiffcp(array, path, args):
    with tempfile.TemporaryDirectory() as d:
        raw = os.path.join(d, "raw.tif")
        Image.fromarray(array).save(raw)
        subprocess.run(["tiffcp"] + args + [raw, path], check=True)


class UNet(torch.nn.Module):
    """A small fully convolutional UNet: 3 -> 2 channels, 16 base channels, one down/up level."""

    def __init__(self, cin=3, cout=2, base=16):
        super().__init__()
        c = torch.nn.Conv2d
        self.enc1 = torch.nn.Sequential(c(cin, base, 3, padding=1), torch.nn.ReLU(), c(base, base, 3, padding=1),
                                        torch.nn.ReLU())
        self.enc2 = torch.nn.Sequential(c(base, 2 * base, 3, padding=1), torch.nn.ReLU(),
                                        c(2 * base, 2 * base, 3, padding=1), torch.nn.ReLU())
        self.up = torch.nn.ConvTranspose2d(2 * base, base, 2, stride=2)
        self.dec = torch.nn.Sequential(c(2 * base, base, 3, padding=1), torch.nn.ReLU(), c(base, base, 3, padding=1),
                                       torch.nn.ReLU())
        self.head = c(base, cout, 1)

    def forward(self, x):
        e1 = self.enc1(x)
        e2 = self.enc2(torch.nn.functional.max_pool2d(e1, 2))
        d = self.dec(torch.cat([self.up(e2), e1], 1))
        return self.head(d)


class Encoder(torch.nn.Module):
    """A small patch encoder: any window size in, one 128-value feature vector per window out ([B, 128])."""

    def __init__(self, cin=3, dim=128):
        super().__init__()
        c = torch.nn.Conv2d
        self.body = torch.nn.Sequential(c(cin, 32, 3, stride=2, padding=1), torch.nn.ReLU(),
                                        c(32, 64, 3, stride=2, padding=1), torch.nn.ReLU(),
                                        c(64, dim, 3, stride=2, padding=1), torch.nn.ReLU(),
                                        c(dim, dim, 3, padding=1), torch.nn.ReLU())

    def forward(self, x):
        return self.body(x).mean(dim=(2, 3))


class Classifier(torch.nn.Module):
    """Encoder with a linear head: K class logits per window ([B, K])."""

    def __init__(self, encoder, classes=2):
        super().__init__()
        self.encoder = encoder
        self.head = torch.nn.Linear(128, classes)

    def forward(self, x):
        return self.head(self.encoder(x))


class BlobDetector(torch.nn.Module):
    """Bright round blobs as boxes, [B, N, 6]: x1, y1, x2, y2, score, class 0 in window pixels, the first N
    blobs in raster order (rows of zeros pad). A blob pixel is brighter than `threshold` (grey, inputs in [0, 1]);
    each pixel's depth is how many erosions by a cross it survives (its city-block distance to the background,
    up to `max_radius`: a disc's radius at its centre); a blob is a depth that is the highest of its 9x9
    neighbourhood and at least `min_depth`, the first in raster order among equals, its box the square of that
    radius around it, its score the depth over `max_radius`. Depth looks only at the blob itself (outside the
    window counts as blob), so every window that holds a blob whole finds it alike."""

    def __init__(self, boxes: int = 64, threshold: float = 0.45, max_radius: int = 24, min_depth: int = 4):
        super().__init__()
        self.boxes = boxes
        self.threshold = threshold
        self.max_radius = max_radius
        self.min_depth = min_depth

    def forward(self, x):
        mask = (x.mean(1, keepdim=True) > self.threshold).float()
        depth = torch.zeros_like(mask)
        h, w = mask.size(2), mask.size(3)
        for _ in range(self.max_radius):
            depth = depth + mask
            m = torch.nn.functional.pad(mask, [1, 1, 1, 1], value=1.0)
            mask = torch.min(torch.min(torch.min(m[:, :, :h, 1:w + 1], m[:, :, 2:, 1:w + 1]),
                                       torch.min(m[:, :, 1:h + 1, :w], m[:, :, 1:h + 1, 2:])), mask)
        peak = (depth == torch.nn.functional.max_pool2d(depth, 9, 1, 4)) & (depth >= float(self.min_depth))
        padded = torch.nn.functional.pad(depth, [4, 4, 4, 4], value=-1.0)
        for dy in range(-4, 1):
            for dx in range(-4, 5):
                if dy < 0 or dx < 0:  # an equal value earlier in raster order keeps that one
                    peak = peak & (padded[:, :, 4 + dy:4 + dy + h, 4 + dx:4 + dx + w] != depth)
        out = torch.zeros(x.size(0), self.boxes, 6, device=x.device)
        for i in range(x.size(0)):
            index = peak[i, 0].flatten().nonzero().flatten()[: self.boxes]
            n = index.numel()
            cx = (index % w).float() + 0.5
            cy = torch.div(index, w, rounding_mode="floor").float() + 0.5
            r = depth[i, 0].flatten()[index]
            out[i, :n, 0] = cx - r
            out[i, :n, 1] = cy - r
            out[i, :n, 2] = cx + r
            out[i, :n, 3] = cy + r
            out[i, :n, 4] = r / float(self.max_radius)
        return out


class BlobInstances(torch.nn.Module):
    """Instance ids, [B, 1, h, w]: each 8-connected blob of pixels brighter than `threshold` (grey, inputs in
    [0, 1]) is one object whose window-local id is the largest raster index + 1 of its pixels (InstanSeg's
    TorchScript models return such maps). Ids spread within blobs until they stop changing: a 3x3 max for
    the diagonal steps, then the max of each run of blob pixels along rows and along columns (prefix maxima
    of run-keyed values both ways), so a few rounds reach across a blob. A blob that a window holds whole
    gets the same pixels in every window."""

    def __init__(self, threshold: float = 0.45):
        super().__init__()
        self.threshold = threshold

    def run_max(self, ids, mask, big: float):
        # Along the last dimension: every pixel of a run of blob pixels gets the run's largest id. A run is
        # keyed by the position of the background pixel before it, so prefix maxima never cross runs.
        w = ids.size(3)
        col = torch.arange(w, dtype=ids.dtype, device=ids.device).view(1, 1, 1, w).expand_as(ids)
        before = torch.cummax(torch.where(mask, torch.full_like(ids, -1.0), col), 3)[0] + 1
        forward = torch.cummax(before * big + ids, 3)[0] - before * big
        after = torch.flip(torch.cummin(torch.flip(torch.where(mask, torch.full_like(ids, float(w)), col), [3]),
                                        3)[0], [3])
        backward = torch.flip(torch.cummax(torch.flip((w - after) * big + ids, [3]), 3)[0], [3]) - (w - after) * big
        return torch.max(forward, backward) * mask

    def forward(self, x):
        mask = x.mean(1, keepdim=True) > self.threshold
        h, w = mask.size(2), mask.size(3)
        big = float(h * w + 1)
        maskd = mask.double()
        ids = maskd * torch.arange(1, h * w + 1, dtype=torch.float64, device=x.device).view(1, 1, h, w)
        while True:
            grown = torch.nn.functional.max_pool2d(ids, 3, 1, 1) * maskd
            grown = self.run_max(grown, mask, big)
            grown = self.run_max(grown.transpose(2, 3), mask.transpose(2, 3), big).transpose(2, 3)
            if bool(torch.equal(grown, ids)):
                break
            ids = grown
        return ids.float()


class ThreeHeads(torch.nn.Module):
    """HoVerNet's three outputs from one small trunk: nuclear pixels, horizontal/vertical maps, types."""

    def __init__(self, cin: int = 3, width: int = 8, types: int = 3):
        super().__init__()
        self.trunk = torch.nn.Sequential(
            torch.nn.Conv2d(cin, width, 3, padding=1), torch.nn.ReLU(),
            torch.nn.Conv2d(width, width, 3, padding=1), torch.nn.ReLU())
        self.np_head = torch.nn.Conv2d(width, 2, 1)
        self.hv_head = torch.nn.Conv2d(width, 2, 1)
        self.tp_head = torch.nn.Conv2d(width, types, 1)

    def forward(self, x) -> Dict[str, torch.Tensor]:
        f = self.trunk(x)
        return {"np": self.np_head(f), "hv": torch.tanh(self.hv_head(f)), "tp": self.tp_head(f)}


class ThreeHeadsAsTuple(ThreeHeads):
    """ThreeHeads' outputs as a tuple (np, hv, tp), without their names (heads.pt's weights fit): the tests'
    .pt2 package whose outputs are picked by index only."""

    def forward(self, x) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        out = super().forward(x)
        return out["np"], out["hv"], out["tp"]


def make_heads():
    torch.manual_seed(0)
    torch.jit.script(ThreeHeads().eval()).save(os.path.join(ROOT, "models/heads.pt"))


def make_encoders():
    torch.manual_seed(0)
    encoder = Encoder().eval()
    torch.jit.script(encoder).save(os.path.join(ROOT, "models/encoder.pt"))
    torch.jit.script(Classifier(encoder).eval()).save(os.path.join(ROOT, "models/classifier.pt"))


def make_detector():
    torch.jit.script(BlobDetector().eval()).save(os.path.join(ROOT, "models/detector.pt"))


def make_instances():
    torch.jit.script(BlobInstances().eval()).save(os.path.join(ROOT, "models/instances.pt"))


def main():
    if "--encoders" in sys.argv[1:]:
        make_encoders()
        return
    if "--detector" in sys.argv[1:]:
        make_detector()
        return
    if "--instances" in sys.argv[1:]:
        make_instances()
        return
    if "--heads" in sys.argv[1:]:
        make_heads()
        return
    rng = np.random.default_rng(1234)
    img, _ = rgb_image(4096, 4096, 900, rng)
    tiff_via_tiffcp(img, os.path.join(ROOT, "images/blobs_4096.tif"),
                    ["-t", "-w", "256", "-l", "256", "-c", "zip:2"])
    bg = background(768, 1024, rng)
    inten, _ = blobs(768, 1024, 120, rng)
    gray16 = np.clip((bg * 0.8 + inten * 160) * 256, 0, 65535).astype(np.uint16)
    tiff_via_tiffcp(gray16, os.path.join(ROOT, "images/cells_16bit.tif"), ["-s", "-r", "64", "-c", "lzw:2"])
    small, _ = rgb_image(150, 200, 12, rng)
    Image.fromarray(small).save(os.path.join(ROOT, "images/small.png"))
    for i in range(8):
        img, mask = rgb_image(384, 384, 40, rng, noise=4.0)
        Image.fromarray(img).save(os.path.join(ROOT, f"train/images/train_{i:02d}.png"))
        Image.fromarray(mask).save(os.path.join(ROOT, f"train/labels/train_{i:02d}.png"))
    torch.manual_seed(0)
    model = torch.jit.script(UNet().eval())
    model.save(os.path.join(ROOT, "models/init.pt"))
    # What users often hand over by mistake: a pickled state_dict, not TorchScript (tests check the message).
    torch.save(torch.nn.Conv2d(3, 2, 1).state_dict(), os.path.join(ROOT, "models/state_dict.pt"))
    make_encoders()
    make_detector()
    make_instances()
    make_heads()


if __name__ == "__main__":
    main()
