#!/usr/bin/env python3
"""Export a trained PyTorch model to a file tiler loads: TorchScript (.pt) or an AOTInductor package (.pt2).

    python3 scripts/export_model.py --module mypkg.models:UNet --weights best.pth --out model.pt \
        --in-channels 3 --window 256
    python3 scripts/export_model.py --module mypkg.models:UNet --weights best.pth --out model.pt2 --window 256
    python3 scripts/export_model.py --encoder torchvision:resnet50 --pretrained --out resnet50.pt --window 224
    python3 scripts/export_model.py --encoder timm:vit_small_patch16_224 --weights uni.pth --out enc.pt \
        --window 224

A segmentation model (--module) returns NCHW maps and is stitched. An encoder (--encoder LIB:NAME: a torchvision
or timm backbone with its classification head removed, or any --module that returns [B, D]) gives one feature
vector per window: `tiler --task embed` writes them to <stem>.h5 (TRIDENT/CLAM layout); a classifier's [B, K]
logits go to `tiler --task classify`. Backbones trained on ImageNet expect its normalisation: run tiler with
--mean 0.485,0.456,0.406 --std 0.229,0.224,0.225 (inputs are scaled to [0, 1] first), and a ViT with its fixed
--window (224). --weights takes a state_dict (torch.save(model.state_dict(), ...)) or a TorchScript file of the
same network (its parameters).

TorchScript (--format torchscript, or an --out not ending in .pt2): the model must be fully convolutional (any
window size) and take one NCHW float tensor; torch.jit.script is tried first (keeps control flow),
torch.jit.trace is the fallback. tiler probes the output: channels, and a scale that is an exact integer
multiple or fraction of the window. Models that return a tuple or dict work too (tiler takes the first tensor,
or the one named by --output_key).

.pt2 (--format pt2, or an --out ending in .pt2; PyTorch 2.6 or later, with a C++ compiler, on the device the
package is for: --device): torch.export with a dynamic batch dimension, then AOTInductor compiles it for the
one window size given. The package records that window, the dynamic batch and the input channels as metadata
(tiler_window, tiler_batch, tiler_in_channels): a package does not check its inputs, so tiler runs it only at
those. A model that returns a dict of tensors keeps its keys (torch.export records them in the package's call
spec): --output_key and --heads take them, or an index in the dict's order; a tuple's outputs are picked by
index. The package runs in the precision it was compiled in: tiler runs it with --precision auto or fp32.

Either file is checked against the eager model on a random batch before the script says it is done (a package
in a child process: where PyTorch's Python loader crashes, the script says so and exits 3 with the package
written; tiler's loader is LibTorch's C++ one).
"""
import argparse
import importlib
import os
import subprocess
import sys
import tempfile

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


def load_weights(model, path):
    """A state_dict file, or a TorchScript file of the same network."""
    try:
        state = torch.jit.load(path, map_location="cpu").state_dict()
    except RuntimeError:  # not TorchScript: a torch.save()'d state_dict
        state = torch.load(path, map_location="cpu")
        state = state.get("state_dict", state) if isinstance(state, dict) else state
    model.load_state_dict(state)


def first(output):
    """The first tensor of a model's output (a tensor, tuple, list or dict)."""
    if torch.is_tensor(output):
        return output
    return next(iter(output.values())) if isinstance(output, dict) else output[0]


def export_torchscript(model, example, out):
    try:
        exported = torch.jit.script(model)
    except Exception as e:  # noqa: BLE001 - scripting fails on dynamic Python; tracing is the fallback
        print(f"torch.jit.script failed ({e.__class__.__name__}); tracing instead")
        exported = torch.jit.trace(model, example)
    exported.save(out)
    return exported


def export_pt2(model, example, out, in_channels, window):
    """torch.export with a dynamic batch, then AOTInductor's package with tiler's metadata at `out`."""
    from torch.export import Dim, export

    import torch._inductor

    # The example batch is 2: torch.export specialises sizes 0 and 1, so a dynamic batch needs another.
    batch = Dim("batch", min=1, max=65536)
    program = export(model, (example,), dynamic_shapes=({0: batch},))
    metadata = {"tiler_window": f"{window}x{window}", "tiler_batch": "dynamic", "tiler_in_channels": str(in_channels)}
    torch._inductor.aoti_compile_and_package(
        program, package_path=out, inductor_configs={"aot_inductor.metadata": metadata})


# Loads a package and runs it on a saved batch in a child process: PyTorch's Python loader crashes on some
# machines (a segfault in _load_aoti seen with PyTorch 2.11 on CUDA) where LibTorch's C++ loader, tiler's, runs
# the same package.
CHECK_IN_CHILD = """
import sys, torch, torch._inductor
package, batch, result = sys.argv[1:]
out = torch._inductor.aoti_load_package(package)(torch.load(batch))
torch.save(out if torch.is_tensor(out) else dict(out) if isinstance(out, dict) else list(out), result)
"""


def run_package_in_child(package, batch):
    """The package's output for `batch`, or None (with the reason printed) if the child died."""
    with tempfile.TemporaryDirectory() as tmp:
        batch_path, result_path = os.path.join(tmp, "batch.pt"), os.path.join(tmp, "result.pt")
        torch.save(batch, batch_path)
        child = subprocess.run([sys.executable, "-c", CHECK_IN_CHILD, package, batch_path, result_path])
        if child.returncode != 0:
            why = f"signal {-child.returncode}" if child.returncode < 0 else f"exit {child.returncode}"
            print(f"wrote {package}, but loading it in this Python to check it failed ({why}); tiler loads packages "
                  "with LibTorch's own loader: compare a tiler run of it with one of the TorchScript model")
            return None
        return torch.load(result_path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    which = ap.add_mutually_exclusive_group(required=True)
    which.add_argument("--module", help="package.module:ClassName of the network")
    which.add_argument("--encoder", help="torchvision:NAME or timm:NAME: a backbone as a patch encoder ([B, D])")
    ap.add_argument("--pretrained", action="store_true", help="--encoder: the library's weights (downloaded)")
    ap.add_argument("--kwargs", default="{}", help="constructor arguments as a Python dict literal")
    ap.add_argument("--weights", help="a state_dict (torch.save(model.state_dict(), ...)) or a TorchScript file")
    ap.add_argument("--out", required=True)
    ap.add_argument("--format", choices=["auto", "torchscript", "pt2"], default="auto",
                    help="auto: pt2 when --out ends in .pt2, else torchscript")
    ap.add_argument("--device", default="cpu", help="pt2: the device the package is compiled for (cpu, cuda)")
    ap.add_argument("--in-channels", type=int, default=3)
    ap.add_argument("--window", type=int, default=256)
    args = ap.parse_args()
    fmt = args.format if args.format != "auto" else ("pt2" if args.out.endswith(".pt2") else "torchscript")

    if args.encoder:
        model = build_encoder(args.encoder, args.pretrained)
    else:
        mod_name, cls_name = args.module.split(":")
        model = getattr(importlib.import_module(mod_name), cls_name)(**eval(args.kwargs))
    if args.weights:
        load_weights(model, args.weights)
    device = torch.device(args.device if fmt == "pt2" else "cpu")
    model = model.eval().to(device)
    example = torch.rand(2, args.in_channels, args.window, args.window, device=device)
    with torch.no_grad():
        check = torch.rand(3, args.in_channels, args.window, args.window, device=device)  # another batch size
        if fmt == "pt2":
            export_pt2(model, example, args.out, args.in_channels, args.window)
            got = run_package_in_child(args.out, check)
            if got is None:
                sys.exit(3)
            got = first(got)
        else:
            got = first(export_torchscript(model, example[:1], args.out)(check))
        want = first(model(check))
    diff = (want - got).abs().max().item()
    # On CUDA both sides may take TF32 convolutions, summed in other orders: a bound relative to the output.
    bound = 1e-4 if device.type == "cpu" else 1e-2 * max(1.0, want.abs().max().item())
    assert diff < bound, f"{args.out}: the exported model differs from the eager one by {diff}"
    shape = tuple(got.shape[1:])
    print(f"wrote {args.out} ({fmt}): output (batch, {', '.join(map(str, shape))}) for input (batch, "
          f"{args.in_channels}, {args.window}, {args.window}); {diff:.2g} from the eager model")
    if len(shape) == 1:
        print(f"one vector of {shape[0]} values per window: tiler --task embed -m {args.out} --window {args.window}"
              " (--task classify for class scores)")


if __name__ == "__main__":
    main()
