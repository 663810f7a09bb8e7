#!/usr/bin/env python3
"""Export a trained PyTorch segmentation model to the TorchScript file tiler loads.

    python3 scripts/export_torchscript.py --module mypkg.models:UNet --weights best.pth --out model.pt \
        --in-channels 3 --window 256

The model must be fully convolutional (any window size) and take one NCHW float tensor. tiler probes the
output: channels, and a scale that is an exact integer multiple or fraction of the window. Models that return
a tuple or dict work too (tiler takes the first tensor, or the one named by --output_key).

torch.jit.script is tried first (keeps control flow); torch.jit.trace is the fallback. The exported file is
checked against the eager model on a random window before it is written.
"""
import argparse
import importlib

import torch


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--module", required=True, help="package.module:ClassName of the network")
    ap.add_argument("--kwargs", default="{}", help="constructor arguments as a Python dict literal")
    ap.add_argument("--weights", help="state_dict saved with torch.save(model.state_dict(), ...)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--in-channels", type=int, default=3)
    ap.add_argument("--window", type=int, default=256)
    args = ap.parse_args()

    mod_name, cls_name = args.module.split(":")
    model = getattr(importlib.import_module(mod_name), cls_name)(**eval(args.kwargs))
    if args.weights:
        state = torch.load(args.weights, map_location="cpu")
        model.load_state_dict(state.get("state_dict", state) if isinstance(state, dict) else state)
    model.eval()
    example = torch.rand(1, args.in_channels, args.window, args.window)
    try:
        exported = torch.jit.script(model)
    except Exception as e:  # noqa: BLE001 - scripting fails on dynamic Python; tracing is the fallback
        print(f"torch.jit.script failed ({e.__class__.__name__}); tracing instead")
        exported = torch.jit.trace(model, example)
    with torch.no_grad():
        want, got = model(example), exported(example)
    first = lambda o: o if torch.is_tensor(o) else (next(iter(o.values())) if isinstance(o, dict) else o[0])
    diff = (first(want) - first(got)).abs().max().item()
    assert diff < 1e-4, f"exported model differs from the eager one by {diff}"
    exported.save(args.out)
    print(f"wrote {args.out}: output {tuple(first(got).shape)} for input {tuple(example.shape)}")


if __name__ == "__main__":
    main()
