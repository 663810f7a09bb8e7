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

    python3 scripts/export_model.py --card model/rdf.yaml      # or a package directory, or a .zip of one

--card converts a bioimage.io package (spec 0.4 or 0.5) whose runnable weights are a `pytorch_state_dict` and a
Python architecture into one with `torchscript` weights: the architecture is imported from the package's own
file (or, for `import_from` / `module:callable`, an installed module), built with the card's kwargs, given the
state dict, scripted (traced with the test input where scripting fails), and run on the card's test input
through the card's preprocessing; with its postprocessing the result must match the card's test output under
the card's tolerance (|out - expected| <= absolute + relative x |expected|, mismatched elements per million).
The package is written beside the input (--out to choose): the card, its weights gaining a `torchscript` entry
(source, sha256, pytorch_version, parent: pytorch_state_dict), and the files the card names. The last line of
stdout is the path of the package written; an error names the file and the problem and exits 1.
"""
import argparse
import copy
import hashlib
import importlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np
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


# ---- bioimage.io packages (--card) ----


class CardError(Exception):
    """A package that cannot be converted: the message names the file and the problem."""


def card_yaml_loader():
    """PyYAML's safe loader read as YAML 1.2 reads a card: 1e-6 is a number, yes/no and dates stay strings
    (PyYAML's 1.1 rules would make the spec's `eps: 1e-6` a string and turn timestamps into dates)."""
    import yaml

    dropped = {"tag:yaml.org,2002:bool", "tag:yaml.org,2002:float", "tag:yaml.org,2002:timestamp"}

    class Loader(yaml.SafeLoader):
        pass

    Loader.yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in resolvers if tag not in dropped]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
    Loader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                                 list("tTfF"))
    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
                   r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
        list("-+0123456789."))
    return Loader


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def check_sha256(path, expected, field, shown):
    if expected is None:
        return
    got = sha256_of(path)
    if got != str(expected).lower():
        raise CardError(f"{shown}: sha256 {got} differs from the card's {field} ({expected})")


class Package:
    """A package's directory (a zip's extracted into a temporary one) and its card's data."""

    def __init__(self, card_path, root, shown, zip_path=None):
        self.card_path, self.root, self.shown, self.zip_path = Path(card_path), Path(root), shown, zip_path
        try:
            with open(card_path, encoding="utf-8") as f:
                import yaml
                self.card = yaml.load(f, Loader=card_yaml_loader())
        except OSError as e:
            raise CardError(f"{shown}: {e.strerror}")
        except Exception as e:  # noqa: BLE001 - yaml's errors: the card is not YAML
            raise CardError(f"{shown}: not a YAML model description: {e}")
        if not isinstance(self.card, dict):
            raise CardError(f"{shown}: not a YAML mapping")

    def name(self, path):
        """A package file as the user knows it: a zip's member as zip:member."""
        return f"{self.zip_path}:{Path(path).relative_to(self.root)}" if self.zip_path else str(path)

    def file(self, value, field):
        """The package's file a card field names (relative to the card; never outside the package)."""
        if not isinstance(value, str) or not value:
            raise CardError(f"{self.shown}: {field} is missing")
        if "://" in value:
            raise CardError(f"{self.shown}: {field} is a URL ({value}); download it into the package and name it "
                            "relative to the card")
        rel = os.path.normpath(value)
        if os.path.isabs(value) or rel == ".." or rel.startswith(".." + os.sep):
            raise CardError(f"{self.shown}: {field} '{value}' lies outside the package; a card names its files "
                            "relative to its own directory")
        path = self.root / rel
        real_root, real = os.path.realpath(self.root), os.path.realpath(path)
        if os.path.commonpath([real_root, real]) != real_root:
            raise CardError(f"{self.shown}: {field} '{value}' leads outside the package (to {real}) through a "
                            "symbolic link")
        if not path.is_file():
            raise CardError(f"{self.shown}: {field} '{value}': no such file in the package")
        return path


def open_package(given, tmp):
    """A Package for --card's value: a card file, a package directory, or a .zip of one."""
    p = Path(given)
    if not p.exists():
        raise CardError(f"{given}: no such file or directory")
    names = ("rdf.yaml", "bioimageio.yaml", "model.yaml")
    if p.is_dir() or zipfile.is_zipfile(p):
        root = p
        if not p.is_dir():
            root = Path(tmp) / "package"
            extract_zip(p, root)
            # As tiler reads a zip: the card at the archive's root or in its one top folder.
            entries = list(root.iterdir())
            if len(entries) == 1 and entries[0].is_dir():
                root = entries[0]
        cards = [root / n for n in names if (root / n).is_file()]
        cards = cards or sorted(root.glob("*.bioimageio.yaml")) + sorted(root.glob("*.rdf.yaml"))
        if len(cards) != 1:
            raise CardError(f"{given}: " + ("holds no rdf.yaml or bioimageio.yaml" if not cards else
                                            f"holds several cards ({', '.join(c.name for c in cards)}); give one"))
        zipped = given if root != p else None
        return Package(cards[0], root, f"{given}:{cards[0].name}" if zipped else str(cards[0]), zipped)
    return Package(p, p.parent, given)


MAX_EXTRACTED_BYTES = 8 << 30


def extract_zip(zip_path, root):
    """A zip's members into `root`; a member whose name would leave it (absolute, ..) is refused by name."""
    try:
        with zipfile.ZipFile(zip_path) as z:
            infos = z.infolist()
            # Sizes from the directory bound what extraction writes (zipfile reads no member past its size).
            total = sum(info.file_size for info in infos)
            if total > MAX_EXTRACTED_BYTES:
                raise CardError(f"{zip_path}: its members hold {total} bytes, over the {MAX_EXTRACTED_BYTES} a "
                                "model package is taken to hold")
            names = [info.filename for info in infos]
            for name in {n for n in names if names.count(n) > 1}:
                raise CardError(f"{zip_path}: member '{name}' is in the archive twice; which one is meant is not known")
            for info in infos:
                if info.flag_bits & 1:
                    raise CardError(f"{zip_path}: member '{info.filename}' is encrypted; a plain archive is read")
                name = os.path.normpath(info.filename)
                if info.filename.startswith(("/", "\\")) or name == ".." or name.startswith(".." + os.sep) or \
                        os.path.isabs(name) or ":" in name.split(os.sep)[0]:
                    raise CardError(f"{zip_path}: member '{info.filename}' lies outside the package")
                if (info.external_attr >> 16) & 0o170000 == 0o120000:
                    raise CardError(f"{zip_path}: member '{info.filename}' is a symbolic link")
            z.extractall(root)
    except zipfile.BadZipFile as e:
        raise CardError(f"{zip_path}: not a readable zip ({e})")


# 0.4 axis letters as 0.5 axis ids.
V04_AXES = {"b": "batch", "c": "channel", "i": "index", "t": "time"}


def v04_axes(letters):
    return [V04_AXES.get(a, a) for a in letters]


def v05_axis_id(axis):
    if axis.get("id") is not None:
        return str(axis["id"])
    kind = axis.get("type", "?")
    return "x" if kind == "space" else kind


class Tensor:
    """One input or output of a card as the conversion needs it."""

    def __init__(self, name, dims, test, test_sha, steps, dtype=None):
        self.name, self.dims, self.test, self.test_sha, self.steps, self.dtype = \
            name, dims, test, test_sha, steps, dtype


class Card:
    """A 0.4 or 0.5 model description read into one shape."""

    def __init__(self, pkg):
        self.raw = card = pkg.card
        shown = pkg.shown
        version = card.get("format_version")
        # The version first: an older card's other fields differ (0.3 had no type).
        if version is None:
            raise CardError(f"{shown}: format_version is missing (a card of spec 0.3 or older?); bioimageio.spec "
                            "converts an older card to 0.5")
        m = re.match(r"^(\d+)\.(\d+)\.", str(version))
        self.version = (int(m.group(1)), int(m.group(2))) if m else None
        if self.version not in ((0, 4), (0, 5)):
            raise CardError(f"{shown}: format_version '{version}': export_model.py reads spec 0.4 and 0.5 cards "
                            "(bioimageio.spec converts older ones)")
        if card.get("type") != "model":
            raise CardError(f"{shown}: type '{card.get('type', '')}' is not a model")
        for io in ("inputs", "outputs"):
            if not isinstance(card.get(io), list) or len(card[io]) != 1:
                n = len(card[io]) if isinstance(card.get(io), list) else 0
                raise CardError(f"{shown}: {io} holds {n} tensors; tiler feeds and reads one")
        weights = card.get("weights")
        if not isinstance(weights, dict):
            raise CardError(f"{shown}: weights is missing")
        if "torchscript" in weights:
            given = weights["torchscript"].get("source") if isinstance(weights["torchscript"], dict) else None
            raise CardError(f"{shown}: weights.torchscript is given already ({given}); tiler runs this package as "
                            "it is")
        self.state = weights.get("pytorch_state_dict")
        if not isinstance(self.state, dict):
            raise CardError(f"{shown}: weights has {', '.join(weights) or 'nothing'}; export_model.py converts "
                            "pytorch_state_dict weights")
        self.input = self.tensor(card["inputs"][0], "inputs[0]", "preprocessing", shown)
        self.output = self.tensor(card["outputs"][0], "outputs[0]", "postprocessing", shown)
        self.tolerance = self.read_tolerance(card.get("config") or {}, shown)

    def tensor(self, t, where, steps_key, shown):
        if not isinstance(t, dict) or not isinstance(t.get(steps_key) or [], list):
            raise CardError(f"{shown}: {where} is not a mapping with a list of {steps_key} steps")
        if any(not isinstance(s, dict) for s in t.get(steps_key) or []):
            raise CardError(f"{shown}: {where}.{steps_key} holds a step that is not a mapping")
        if self.version == (0, 4):
            name = t.get("name", "")
            dims = v04_axes(str(t.get("axes", "")))
            steps = [(s.get("name"), s.get("kwargs") or {}) for s in t.get(steps_key) or []]
            return Tensor(name, dims, v04_test_tensor(self, where, shown), None, steps, t.get("data_type"))
        axes = t.get("axes") or []
        if not isinstance(axes, list) or any(not isinstance(a, dict) for a in axes):
            raise CardError(f"{shown}: {where}.axes is not a list of axes (spec 0.5: mappings with a type)")
        dims = [v05_axis_id(a) for a in axes]
        test = t.get("test_tensor")
        if not isinstance(test, dict) or not test.get("source"):
            raise CardError(f"{shown}: {where}.test_tensor is missing; the conversion is checked against the card's "
                            "test tensors")
        steps = [(s.get("id"), s.get("kwargs") or {}) for s in t.get(steps_key) or []]
        return Tensor(str(t.get("id", "input" if where == "inputs[0]" else "output")), dims,
                      (f"{where}.test_tensor.source", test["source"]), test.get("sha256"), steps)

    def read_tolerance(self, config, shown):
        rel, abs_, ppm = 1e-3, 1e-3, 100.0  # the spec's defaults, as tiler check-model takes them
        bio = config.get("bioimageio") or {}
        legacy = (bio.get("test_kwargs") or {}).get("torchscript") or {}
        rel, abs_ = legacy.get("relative_tolerance", rel), legacy.get("absolute_tolerance", abs_)
        for entry in bio.get("reproducibility_tolerance") or []:
            formats, ids = entry.get("weights_formats") or [], entry.get("output_ids") or []
            if (not formats or "torchscript" in formats) and (not ids or self.output.name in ids):
                rel = entry.get("relative_tolerance", 1e-3)
                abs_ = entry.get("absolute_tolerance", 1e-3)
                ppm = entry.get("mismatched_elements_per_million", 100.0)
                break
        try:
            return float(rel), float(abs_), float(ppm)
        except (TypeError, ValueError):
            raise CardError(f"{shown}: config.bioimageio's tolerance ({rel}, {abs_}, {ppm}) is not numbers")


def v04_test_tensor(card, where, shown):
    """A 0.4 card's test tensor of `where` (test_inputs / test_outputs: one file each)."""
    key = "test_inputs" if where == "inputs[0]" else "test_outputs"
    files = card.raw.get(key)
    if not isinstance(files, list) or not files:
        raise CardError(f"{shown}: {key} is missing; the conversion is checked against the card's test tensors")
    return (f"{key}[0]", files[0])


def architecture(pkg, card):
    """The callable the card's pytorch_state_dict names, imported; and its kwargs."""
    state, shown = card.state, pkg.shown
    if card.version == (0, 4):
        arch = state.get("architecture")
        if not isinstance(arch, str) or ":" not in arch:
            raise CardError(f"{shown}: weights.pytorch_state_dict.architecture '{arch}' is not file.py:Callable "
                            "or module:callable")
        where, _, name = arch.rpartition(":")
        source = where if where.endswith(".py") or "/" in where or "://" in where else None
        module = None if source else where
        sha, field = state.get("architecture_sha256"), "weights.pytorch_state_dict.architecture"
    else:
        arch = state.get("architecture")
        if not isinstance(arch, dict) or not arch.get("callable"):
            raise CardError(f"{shown}: weights.pytorch_state_dict.architecture.callable is missing")
        name, source, module = str(arch["callable"]), arch.get("source"), arch.get("import_from")
        if not source and not module:
            raise CardError(f"{shown}: weights.pytorch_state_dict.architecture has neither source nor import_from")
        sha, field = arch.get("sha256"), "weights.pytorch_state_dict.architecture.source"
    kwargs = (state.get("kwargs") if card.version == (0, 4) else arch.get("kwargs")) or {}
    if source:
        path = pkg.file(source, field)
        check_sha256(path, sha, field.replace(".source", "") + (".sha256" if card.version == (0, 5) else "_sha256"),
                     pkg.name(path))
        mod_name = "bioimageio_architecture_" + re.sub(r"\W", "_", path.stem)
        spec = importlib.util.spec_from_file_location(mod_name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = mod  # torch.jit.script reads the class's source through its module
        sys.path.insert(0, str(path.parent))  # the file's own imports of its package's other files
        try:
            spec.loader.exec_module(mod)
        except Exception as e:  # noqa: BLE001 - whatever the file raises: named with the file
            raise CardError(f"{pkg.name(path)}: importing the architecture failed: {e.__class__.__name__}: {e}")
        finally:
            sys.path.remove(str(path.parent))
        where = pkg.name(path)
    else:
        try:
            mod = importlib.import_module(str(module))
        except Exception as e:  # noqa: BLE001
            raise CardError(f"{shown}: the architecture's module '{module}' does not import here: "
                            f"{e.__class__.__name__}: {e}")
        where = f"module {module}"
    fn = getattr(mod, name, None)
    if not callable(fn):
        raise CardError(f"{where}: has no callable '{name}' (weights.pytorch_state_dict.architecture)")
    # An installed module's callable runs with the card's kwargs: a network class, or a model builder of the
    # libraries that publish them, never whatever else the card names (shutil.rmtree).
    builders = ("torchvision.", "torch.", "monai.", "timm.", "segmentation_models_pytorch.")
    if not source and not (isinstance(fn, type) and issubclass(fn, torch.nn.Module)) and \
            not (str(module) + ".").startswith(builders):
        raise CardError(f"{shown}: the architecture {module}.{name} is neither a torch.nn.Module class nor a "
                        f"model builder of {', '.join(b.rstrip('.') for b in builders)}; tiler does not call it")
    if not isinstance(kwargs, dict):
        raise CardError(f"{shown}: the architecture's kwargs are not a mapping")
    return fn, kwargs, where


def load_state_dict(pkg, card):
    path = pkg.file(card.state.get("source"), "weights.pytorch_state_dict.source")
    check_sha256(path, card.state.get("sha256"), "weights.pytorch_state_dict.sha256", pkg.name(path))
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - not a tensor pickle torch reads without running code
        raise CardError(f"{pkg.name(path)}: not a state dict torch.load reads (weights_only): "
                        f"{e.__class__.__name__}: {e}")
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise CardError(f"{pkg.name(path)}: holds a {type(state).__name__}, not a state dict")
    return path, state


# ---- the spec's pre- and postprocessing steps, in numpy, as bioimageio.core applies them ----


def as_number(value, what):
    try:
        return float(value)
    except (TypeError, ValueError):
        raise CardError(f"{what} '{value}' is not a number")


def reduce_axes(kw, dims, step, version, where):
    """The axes a step's statistics run over (indices), or None for all of them."""
    axes = kw.get("axes")
    if axes is None:
        return None
    ids = v04_axes(str(axes)) if version == (0, 4) else [str(a) for a in axes]
    if version == (0, 4) and kw.get("mode") == "per_dataset":
        ids = ["batch"] + ids
    missing = [a for a in ids if a not in dims]
    if missing:
        raise CardError(f"{where} {step}: axes {missing} are not the tensor's ({', '.join(dims)})")
    return tuple(dims.index(a) for a in ids)


def along(values, axis, dims, x, step, where):
    """A list of per-index values broadcast along `axis` of x (a scalar as it is)."""
    if not isinstance(values, list):
        return as_number(values, f"{where} {step}")
    arr = np.asarray([as_number(v, f"{where} {step}") for v in values], dtype=np.float64)
    if len(arr) == 1 and axis is None:
        return float(arr[0])
    if axis not in dims:
        raise CardError(f"{where} {step}: {len(arr)} values along axis '{axis}', which the tensor "
                        f"({', '.join(dims)}) has not")
    i = dims.index(axis)
    if len(arr) not in (1, x.shape[i]):
        raise CardError(f"{where} {step}: {len(arr)} values along '{axis}' of size {x.shape[i]}")
    shape = [1] * x.ndim
    shape[i] = len(arr)
    return arr.reshape(shape)


def complement_axis(kw, dims):
    """A 0.4 step's per-index values run along the one axis its `axes` leave out (batch aside)."""
    if kw.get("axes") is None:
        return None
    rest = [d for d in dims if d not in set(v04_axes(str(kw["axes"]))) | {"batch"}]
    return rest[0] if len(rest) == 1 else None


def quantile(x, q, axes, method):
    return np.quantile(x, q, axis=axes, keepdims=True, method=method)


def apply_steps(x, tensor, version, where, reference):
    """Applies a tensor's pre- or postprocessing to x; `reference` is the preprocessed input (by its name)."""
    if version == (0, 4) and tensor.dtype:
        try:
            x = x.astype(np.dtype(str(tensor.dtype)))  # bioimageio.core casts a 0.4 tensor to its data_type first
        except TypeError:
            raise CardError(f"{where}: data_type '{tensor.dtype}' is not one numpy knows")
    dims = tensor.dims
    if x.ndim != len(dims):
        raise CardError(f"{where}: the test tensor has {x.ndim} dimensions, the axes {len(dims)} ({', '.join(dims)})")
    for step, kw in tensor.steps:
        if not isinstance(kw, dict):
            raise CardError(f"{where} {step}: kwargs are not a mapping")
        eps = as_number(kw.get("eps", 1e-6), f"{where} {step} eps")
        if step == "ensure_dtype":
            try:
                x = x.astype(np.dtype(str(kw.get("dtype"))))
            except TypeError:
                raise CardError(f"{where} ensure_dtype: dtype '{kw.get('dtype')}' is not one numpy knows")
        elif step == "scale_linear":
            axis = complement_axis(kw, dims) if version == (0, 4) else kw.get("axis")
            x = x * along(kw.get("gain", 1.0), axis, dims, x, step, where) + \
                along(kw.get("offset", 0.0), axis, dims, x, step, where)
        elif step == "fixed_zero_mean_unit_variance" or (step == "zero_mean_unit_variance" and version == (0, 4)
                                                         and kw.get("mode", "fixed") == "fixed"):
            axis = complement_axis(kw, dims) if version == (0, 4) else kw.get("axis")
            mean = along(kw.get("mean"), axis, dims, x, step, where)
            std = along(kw.get("std"), axis, dims, x, step, where)
            x = (x - mean) / (std + eps)
        elif step == "zero_mean_unit_variance":
            axes = reduce_axes(kw, dims, step, version, where)
            x = (x - x.mean(axis=axes, keepdims=True)) / (x.std(axis=axes, keepdims=True) + eps)
        elif step == "scale_range":
            ref = kw.get("reference_tensor")
            source = x if ref is None or ref == tensor.name else reference.get(ref)
            if source is None:
                raise CardError(f"{where} scale_range: reference_tensor '{ref}' is not a tensor of the card")
            axes = reduce_axes(kw, dims, step, version, where)
            lo = quantile(source, as_number(kw.get("min_percentile", 0.0), f"{where} {step}") / 100, axes, "linear")
            hi = quantile(source, as_number(kw.get("max_percentile", 100.0), f"{where} {step}") / 100, axes, "linear")
            x = (x - lo) / (hi - lo + eps)
        elif step == "clip":
            axes = reduce_axes(kw, dims, step, version, where)
            lo, hi = kw.get("min"), kw.get("max")
            if lo is None and kw.get("min_percentile") is not None:
                lo = quantile(x, as_number(kw["min_percentile"], f"{where} clip") / 100, axes, "inverted_cdf")
            if hi is None and kw.get("max_percentile") is not None:
                hi = quantile(x, as_number(kw["max_percentile"], f"{where} clip") / 100, axes, "inverted_cdf")
            if lo is None and hi is None:
                raise CardError(f"{where} clip: neither min nor max is given")
            x = np.clip(x, None if lo is None else np.asarray(lo, dtype=np.float64),
                        None if hi is None else np.asarray(hi, dtype=np.float64)).astype(x.dtype)
        elif step == "sigmoid":
            x = 1.0 / (1.0 + np.exp(-x))
        elif step == "softmax":
            axis = str(kw.get("axis", "channel"))
            if axis not in dims:
                raise CardError(f"{where} softmax: axis '{axis}' is not the tensor's ({', '.join(dims)})")
            e = np.exp(x - x.max(axis=dims.index(axis), keepdims=True))
            x = e / e.sum(axis=dims.index(axis), keepdims=True)
        elif step == "binarize":
            x = x > along(kw.get("threshold"), kw.get("axis"), dims, x, step, where)
        elif step == "scale_mean_variance":
            ref = kw.get("reference_tensor")
            source = reference.get(ref)
            if source is None:
                raise CardError(f"{where} scale_mean_variance: reference_tensor '{ref}' is not the card's input")
            axes = reduce_axes(kw, dims, step, version, where)
            mean, std = x.mean(axis=axes, keepdims=True), x.std(axis=axes, keepdims=True) + eps
            ref_mean, ref_std = source.mean(axis=axes, keepdims=True), source.std(axis=axes, keepdims=True) + eps
            x = (x - mean) / std * ref_std + ref_mean
        else:
            raise CardError(f"{where}: step '{step}' is not one export_model.py applies (ensure_dtype, scale_linear, "
                            "zero_mean_unit_variance, fixed_zero_mean_unit_variance, scale_range, clip, sigmoid, "
                            "softmax, binarize, scale_mean_variance)")
    return x


def compare(got, want, tolerance, where):
    """bioimageio.core's test: an element is off when |got - want| > absolute + relative x |want|; the card
    passes while the off elements are at most its count per million. Returns (off, largest difference)."""
    if got.shape != want.shape:
        raise CardError(f"{where}: the converted model gives shape {list(got.shape)}, the test output is "
                        f"{list(want.shape)}")
    rel, abs_, ppm = tolerance
    got, want = got.astype(np.float64), want.astype(np.float64)
    diff = np.abs(got - want)
    ok = (diff <= abs_ + rel * np.abs(want)) | (np.isnan(got) & np.isnan(want))
    off = int((~ok).sum())
    largest = float(np.nanmax(diff)) if diff.size else 0.0
    if off / max(want.size, 1) * 1e6 > ppm:
        raise CardError(f"{where}: the converted model's output differs from the test output in {off} of "
                        f"{want.size} elements (more than {ppm:g} per million; largest difference {largest:.3g}, "
                        f"tolerance absolute {abs_:g} + relative {rel:g})")
    return off, largest


def tiler_window(card):
    """The input's y, x sizes tiler runs at: a fixed size, or of {min, step} the first at least 256 px (as
    tiler reads a card); None where the card does not say."""
    def pick(size):
        if isinstance(size, dict):
            lo, step = int(size.get("min", 0)), int(size.get("step", 0))
            return lo if step <= 0 or lo >= 256 else lo + step * ((256 - lo + step - 1) // step)
        return int(size) if isinstance(size, (int, float)) else None

    t, dims = card.raw["inputs"][0], card.input.dims
    if "y" not in dims or "x" not in dims:
        return None
    if card.version == (0, 4):
        shape = t.get("shape")
        if isinstance(shape, dict):
            sizes = [{"min": a, "step": b} for a, b in zip(shape.get("min", []), shape.get("step", []))]
        else:
            sizes = shape if isinstance(shape, list) else []
    else:
        sizes = [a.get("size") for a in t.get("axes") or []]
    if len(sizes) != len(dims):
        return None
    try:
        return pick(sizes[dims.index("y")]), pick(sizes[dims.index("x")])
    except (TypeError, ValueError):
        return None


def check_trace_at_window(model, traced, example, card, where):
    """A traced model repeats the path the test input took: where tiler's window differs from the test input,
    the traced model must still agree with the architecture there."""
    window, dims = tiler_window(card), card.input.dims
    shape = list(example.shape)
    if not window or None in window or (shape[dims.index("y")], shape[dims.index("x")]) == window:
        return
    shape[dims.index("y")], shape[dims.index("x")] = window
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(0)).to(example.dtype)
    try:
        want = first(model(x))
    except Exception as e:  # noqa: BLE001 - the architecture itself does not run there: nothing to compare
        print(f"the architecture does not run at tiler's window {window[0]}x{window[1]} ({e.__class__.__name__}); "
              "the traced model is checked at the test input's size only", file=sys.stderr)
        return
    got = first(traced(x))
    diff = float((want - got).abs().max()) if got.shape == want.shape else float("inf")
    if not diff <= 1e-4 * max(1.0, float(want.abs().max())):
        raise CardError(f"{where}: the traced model differs from the architecture at tiler's window "
                        f"{window[0]}x{window[1]} (by {diff:.3g}): its forward depends on the input's size in Python, "
                        "which tracing fixes to the test input's; make it scriptable")


def named_files(value, pkg):
    """The package's files a card's strings name (sources, covers, documentation, file.py:Class, conda:env.yaml)."""
    found = set()
    if isinstance(value, dict):
        for v in value.values():
            found |= named_files(v, pkg)
    elif isinstance(value, list):
        for v in value:
            found |= named_files(v, pkg)
    elif isinstance(value, str) and "://" not in value and len(value) < 4096:
        for candidate in {value, value.split(":")[0], value.split(":", 1)[-1]}:
            rel = os.path.normpath(candidate) if candidate else ""
            if not rel or os.path.isabs(rel) or rel == ".." or rel.startswith(".." + os.sep):
                continue
            path = pkg.root / rel
            if path.is_file() and os.path.commonpath([os.path.realpath(pkg.root), os.path.realpath(path)]) == \
                    os.path.realpath(pkg.root) and path != pkg.card_path:
                found.add(rel)
    return found


def default_out(given):
    """<package>.torchscript beside the package (a card's directory, a package directory or a zip)."""
    p = Path(given).resolve()
    package = p if p.is_dir() or zipfile.is_zipfile(p) else p.parent
    stem = package.stem if package.suffix == ".zip" else package.name
    return package.parent / f"{stem}.torchscript"


def export_card(args):
    """--card: the package with torchscript weights, written; returns its path."""
    with tempfile.TemporaryDirectory() as tmp:
        pkg = open_package(args.card, tmp)
        out = Path(args.out) if args.out else default_out(args.card)
        if out.exists():
            raise CardError(f"{out}: exists; remove it or name another directory with --out")
        card = Card(pkg)

        inputs = {}
        for t, role in ((card.input, "inputs[0]"), (card.output, "outputs[0]")):
            field, source = t.test
            path = pkg.file(source, field)
            check_sha256(path, t.test_sha, field.replace(".source", ".sha256"), pkg.name(path))
            try:
                inputs[role] = np.load(path, allow_pickle=False)
            except Exception as e:  # noqa: BLE001 - numpy's reasons: not an .npy it reads
                raise CardError(f"{pkg.name(path)}: not a .npy array numpy reads ({e})")

        fn, kwargs, arch_where = architecture(pkg, card)
        weights_path, state = load_state_dict(pkg, card)
        try:
            model = fn(**kwargs)
        except Exception as e:  # noqa: BLE001
            raise CardError(f"{arch_where}: building the architecture with the card's kwargs {kwargs} failed: "
                            f"{e.__class__.__name__}: {e}")
        if not isinstance(model, torch.nn.Module):
            raise CardError(f"{arch_where}: the architecture gives a {type(model).__name__}, not a torch.nn.Module")
        try:
            model.load_state_dict(state)
        except Exception as e:  # noqa: BLE001 - missing or unexpected keys, shapes
            raise CardError(f"{pkg.name(weights_path)}: does not fit the architecture: {str(e).strip()}")
        model.eval()

        x = apply_steps(inputs["inputs[0]"], card.input, card.version, f"{pkg.shown}: inputs[0] preprocessing", {})
        example = torch.from_numpy(np.ascontiguousarray(x))
        if example.is_floating_point():
            example = example.float()  # tiler feeds float32
        how = "scripted"
        with torch.no_grad():
            try:
                exported = torch.jit.script(model)
            except Exception as e:  # noqa: BLE001 - scripting fails on dynamic Python; tracing is the fallback
                why = str(e).strip().splitlines()
                print(f"torch.jit.script failed ({e.__class__.__name__}: {why[0] if why else ''}); tracing with the "
                      "test input instead", file=sys.stderr)
                try:
                    exported, how = torch.jit.trace(model, example), "traced"
                except Exception as e:  # noqa: BLE001
                    raise CardError(f"{arch_where}: neither scripting nor tracing with the test input works: "
                                    f"{e.__class__.__name__}: {e}")
            y = first(exported(example)).detach().cpu().numpy()
            if how == "traced":
                check_trace_at_window(model, exported, example, card, arch_where)
        y = apply_steps(y, card.output, card.version, f"{pkg.shown}: outputs[0] postprocessing",
                        {card.input.name: x})
        off, largest = compare(y, inputs["outputs[0]"], card.tolerance, f"{pkg.shown}: outputs[0]")

        files = named_files(pkg.card, pkg)
        ts_name = "weights_torchscript.pt"
        while ts_name in files:
            ts_name = "tiler_" + ts_name
        partial = out.parent / f".{out.name}.partial-{os.getpid()}"
        try:
            partial.mkdir(parents=True)
            for rel in sorted(files):
                (partial / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(pkg.root / rel, partial / rel)
            exported.save(str(partial / ts_name))
            written = copy.deepcopy(pkg.card)
            entry = {"source": ts_name, "sha256": sha256_of(partial / ts_name),
                     "pytorch_version": torch.__version__.split("+")[0], "parent": "pytorch_state_dict"}
            if card.version == (0, 5):
                entry["comment"] = f"{how} by tiler's scripts/export_model.py --card"
            written["weights"]["torchscript"] = entry
            name = pkg.card_path.name
            if name not in ("rdf.yaml", "bioimageio.yaml"):
                name = "rdf.yaml" if card.version == (0, 4) else "bioimageio.yaml"
            import yaml
            class Dumper(yaml.SafeDumper):
                def ignore_aliases(self, data):
                    return True  # a card's YAML anchors written out where they stand

            with open(partial / name, "w", encoding="utf-8") as f:
                yaml.dump(written, f, Dumper=Dumper, sort_keys=False, allow_unicode=True, default_flow_style=False)
            partial.rename(out)
        finally:
            shutil.rmtree(partial, ignore_errors=True)
        print(f"{how} {arch_where} with {weights_path.name}; the test output reproduced with {off} elements off "
              f"(largest difference {largest:.3g})", file=sys.stderr)
        return out



def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    which = ap.add_mutually_exclusive_group(required=True)
    which.add_argument("--module", help="package.module:ClassName of the network")
    which.add_argument("--encoder", help="torchvision:NAME or timm:NAME: a backbone as a patch encoder ([B, D])")
    which.add_argument("--card", help="a bioimage.io card (rdf.yaml), package directory or .zip whose weights are a "
                                      "pytorch_state_dict: writes the package with torchscript weights beside it")
    ap.add_argument("--pretrained", action="store_true", help="--encoder: the library's weights (downloaded)")
    ap.add_argument("--kwargs", default="{}", help="constructor arguments as a Python dict literal")
    ap.add_argument("--weights", help="a state_dict (torch.save(model.state_dict(), ...)) or a TorchScript file")
    ap.add_argument("--out", help="the file written (--card: the package directory; default <package>.torchscript "
                                  "beside the package)")
    ap.add_argument("--format", choices=["auto", "torchscript", "pt2"], default="auto",
                    help="auto: pt2 when --out ends in .pt2, else torchscript")
    ap.add_argument("--device", default="cpu", help="pt2: the device the package is compiled for (cpu, cuda)")
    ap.add_argument("--in-channels", type=int, default=3)
    ap.add_argument("--window", type=int, default=256)
    args = ap.parse_args()
    if args.card:
        try:
            print(export_card(args))
        except CardError as e:
            sys.exit(f"export_model.py: {e}")
        return
    if not args.out:
        ap.error("--out is required with --module or --encoder")
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
