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
samples/models/sample.pt is init.pt fine-tuned on samples/train by `tiler finetune` (scripts/make_sample_model.sh).

Needs Debian's python3-torch, python3-numpy, python3-pil and libtiff-tools (tiffcp). Run from the repo root:
  /usr/bin/python3 samples/make_samples.py              (everything)
  /usr/bin/python3 samples/make_samples.py --encoders   (encoder.pt and classifier.pt only)
"""
import os
import subprocess
import sys
import tempfile

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


def make_encoders():
    torch.manual_seed(0)
    encoder = Encoder().eval()
    torch.jit.script(encoder).save(os.path.join(ROOT, "models/encoder.pt"))
    torch.jit.script(Classifier(encoder).eval()).save(os.path.join(ROOT, "models/classifier.pt"))


def main():
    if "--encoders" in sys.argv[1:]:
        make_encoders()
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


if __name__ == "__main__":
    main()
