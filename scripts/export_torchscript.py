#!/usr/bin/env python3
"""Export a trained PyTorch model to the TorchScript file tiler loads.

    python3 scripts/export_torchscript.py --module mypkg.models:UNet --weights best.pth --out model.pt \
        --in-channels 3 --window 256
    python3 scripts/export_torchscript.py --encoder torchvision:resnet50 --pretrained --out resnet50.pt --window 224
    python3 scripts/export_torchscript.py --encoder timm:vit_small_patch16_224 --weights uni.pth --out enc.pt \
        --window 224

A segmentation model (--module) returns NCHW maps and is stitched. An encoder (--encoder LIB:NAME: a torchvision
or timm backbone with its classification head removed, or any --module that returns [B, D]) gives one feature
vector per window: `tiler --task embed` writes them to <stem>.h5 (TRIDENT/CLAM layout); a classifier's [B, K]
logits go to `tiler --task classify`. Backbones trained on ImageNet expect its normalisation: run tiler with
--mean 0.485,0.456,0.406 --std 0.229,0.224,0.225 (inputs are scaled to [0, 1] first), and a ViT with its fixed
--window (224).

The model must be fully convolutional (any window size) and take one NCHW float tensor. tiler probes the
output: channels, and a scale that is an exact integer multiple or fraction of the window. Models that return
a tuple or dict work too (tiler takes the first tensor, or the one named by --output_key).

torch.jit.script is tried first (keeps control flow); torch.jit.trace is the fallback. The exported file is
checked against the eager model on a random window before it is written.
"""
import argparse
import importlib

import torch


def build_encoder(spec, pretrained):
    """A torchvision or timm backbone whose forward returns pooled features, [B, D]."""
    lib, _, name = spec.partition(":")
    if lib == "timm":
        import timm
        return timm.create_model(name, pretrained=pretrained, num_classes=0)  # num_classes=0: no head
    if lib == "torchvision":
        import torchvision
        model = torchvision.models.get_model(name, weights="DEFAULT" if pretrained else None)
        for head in ("fc", "classifier", "heads", "head"):  # ResNet, EfficientNet/ConvNeXt, ViT, Swin
            if hasattr(model, head):
                setattr(model, head, torch.nn.Identity())
                # ConvNeXt's pooled features are [B, D, 1, 1] without its head: flat, so --task auto sees [B, D].
                return torch.nn.Sequential(model, torch.nn.Flatten(1))
        raise SystemExit(f"{spec}: no classification head (fc, classifier, heads, head) to remove")
    raise SystemExit(f"--encoder takes torchvision:NAME or timm:NAME, not {spec}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    which = ap.add_mutually_exclusive_group(required=True)
    which.add_argument("--module", help="package.module:ClassName of the network")
    which.add_argument("--encoder", help="torchvision:NAME or timm:NAME: a backbone as a patch encoder ([B, D])")
    ap.add_argument("--pretrained", action="store_true", help="--encoder: the library's weights (downloaded)")
    ap.add_argument("--kwargs", default="{}", help="constructor arguments as a Python dict literal")
    ap.add_argument("--weights", help="state_dict saved with torch.save(model.state_dict(), ...)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--in-channels", type=int, default=3)
    ap.add_argument("--window", type=int, default=256)
    args = ap.parse_args()

    if args.encoder:
        model = build_encoder(args.encoder, args.pretrained)
    else:
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
    shape = tuple(first(got).shape)
    print(f"wrote {args.out}: output {shape} for input {tuple(example.shape)}")
    if len(shape) == 2:
        print(f"one vector of {shape[1]} values per window: tiler --task embed -m {args.out} --window {args.window}"
              " (--task classify for class scores)")


if __name__ == "__main__":
    main()
