"""scripts/export_model.py --card: a bioimage.io package (0.4 or 0.5 card, a directory or a zip) whose weights are
a state dict and a Python architecture becomes one with torchscript weights that reproduces the card's test
output, and that `tiler check-model` passes; the spec's processing steps against numbers computed here; and each
refusal names the file and the problem.
Usage: export_model_test.py [TILER] (the tiler binary: check-model on the written package)."""
import argparse
import copy
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
import zipfile
from pathlib import Path

try:
    import torch
except ImportError:  # CMake's Python lacks PyTorch: the one that has it (TILER_PYTHON, else Debian's) runs the test
    python = os.environ.get("TILER_PYTHON") or "/usr/bin/python3"
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        raise
    os.execv(python, [python, *sys.argv])

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts/export_model.py"
TILER = sys.argv.pop(1) if len(sys.argv) > 1 and os.path.isfile(sys.argv[1]) else ""

spec = importlib.util.spec_from_file_location("export_model", SCRIPT)
export_model = importlib.util.module_from_spec(spec)
spec.loader.exec_module(export_model)

ARCHITECTURE = '''import torch


class TinyNet(torch.nn.Module):
    def __init__(self, in_channels: int, out_channels: int, hidden: int = 4):
        super().__init__()
        self.a = torch.nn.Conv2d(in_channels, hidden, 3, padding=1)
        self.b = torch.nn.Conv2d(hidden, out_channels, 1)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


class Untraceable(TinyNet):
    """Not scriptable (a variable argument list); its result depends on the input's width in Python."""

    def forward(self, x, *extra):
        return self.b(torch.relu(self.a(x))) * (2.0 if x.shape[-1] > 40 else 1.0)


class Unscriptable(TinyNet):
    """Not scriptable, but traces to the same model at any size."""

    def forward(self, x, *extra):
        return self.b(torch.relu(self.a(x)))
'''


def sha256(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def net(name="TinyNet"):
    scope = {}
    exec(ARCHITECTURE, scope)  # noqa: S102 - the test's own architecture
    torch.manual_seed(0)
    return scope[name](in_channels=1, out_channels=1, hidden=4).eval()


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def make_package(root, version, net_name="TinyNet"):
    """A package directory: tiny_net.py, state.pt, test tensors (computed here) and a 0.4 or 0.5 card."""
    root = Path(root)
    root.mkdir(parents=True)
    (root / "tiny_net.py").write_text(ARCHITECTURE)
    model = net(net_name)
    torch.save(model.state_dict(), root / "state.pt")
    x = (np.random.default_rng(1).random((1, 1, 32, 32)) * 100 + 20).astype(np.float32)
    np.save(root / "test_input.npy", x)
    if version == "0.4":
        # Per-sample statistics (what the zoo's 0.4 cards mostly use): normalised here in float64.
        pre = (x - x.mean(axis=(2, 3), keepdims=True)) / (x.std(axis=(2, 3), keepdims=True) + 1e-6)
    else:
        pre = (x - 70.0) / (30.0 + 1e-6)  # fixed numbers: tiler's check-model reads them today
    with torch.no_grad():
        y = sigmoid(model(torch.from_numpy(pre.astype(np.float32))).numpy().astype(np.float64))
    np.save(root / "test_output.npy", y.astype(np.float32))
    kwargs = {"in_channels": 1, "out_channels": 1, "hidden": 4}
    if version == "0.4":
        card = {
            "format_version": "0.4.10", "type": "model", "name": "tiny", "description": "a test model",
            "authors": [{"name": "tiler"}], "cite": [{"text": "none", "url": "https://example.com/"}],
            "license": "MIT", "documentation": "README.md", "timestamp": "2024-01-01T00:00:00Z",
            "inputs": [{"name": "raw", "axes": "bcyx", "data_type": "float32", "data_range": [-1e9, 1e9],
                        "shape": [1, 1, 32, 32],
                        "preprocessing": [{"name": "zero_mean_unit_variance",
                                           "kwargs": {"mode": "per_sample", "axes": "yx"}}]}],
            "outputs": [{"name": "prob", "axes": "bcyx", "data_type": "float32", "data_range": [0, 1],
                         "shape": {"reference_tensor": "raw", "scale": [1, 1, 1, 1], "offset": [0, 0, 0, 0]},
                         "postprocessing": [{"name": "sigmoid"}]}],
            "test_inputs": ["test_input.npy"], "test_outputs": ["test_output.npy"],
            "weights": {"pytorch_state_dict": {
                "source": "state.pt", "sha256": sha256(root / "state.pt"),
                "architecture": f"tiny_net.py:{net_name}", "architecture_sha256": sha256(root / "tiny_net.py"),
                "kwargs": kwargs}},
        }
        name = "rdf.yaml"
    else:
        space = {"min": 16, "step": 16} if net_name != "TinyNet" else 32
        card = {
            "format_version": "0.5.4", "type": "model", "name": "tiny", "description": "a test model",
            "authors": [{"name": "tiler"}], "cite": [{"text": "none", "url": "https://example.com/"}],
            "license": "MIT", "documentation": "README.md", "timestamp": "2024-01-01T00:00:00Z",
            "inputs": [{"id": "raw", "axes": [{"type": "batch"}, {"type": "channel", "channel_names": ["raw"]},
                                              {"type": "space", "id": "y", "size": space},
                                              {"type": "space", "id": "x", "size": space}],
                        "test_tensor": {"source": "test_input.npy", "sha256": sha256(root / "test_input.npy")},
                        "preprocessing": [{"id": "ensure_dtype", "kwargs": {"dtype": "float32"}},
                                          {"id": "fixed_zero_mean_unit_variance",
                                           "kwargs": {"mean": 70.0, "std": 30.0}}]}],
            "outputs": [{"id": "prob", "axes": [{"type": "batch"}, {"type": "channel", "channel_names": ["p"]},
                                                {"type": "space", "id": "y",
                                                 "size": {"tensor_id": "raw", "axis_id": "y"}},
                                                {"type": "space", "id": "x",
                                                 "size": {"tensor_id": "raw", "axis_id": "x"}}],
                         "test_tensor": {"source": "test_output.npy", "sha256": sha256(root / "test_output.npy")},
                         "postprocessing": [{"id": "sigmoid"}]}],
            "weights": {"pytorch_state_dict": {
                "source": "state.pt", "sha256": sha256(root / "state.pt"),
                "architecture": {"source": "tiny_net.py", "sha256": sha256(root / "tiny_net.py"),
                                 "callable": net_name, "kwargs": kwargs},
                "pytorch_version": "1.13"}},
        }
        name = "bioimageio.yaml"
    (root / "README.md").write_text("a test model\n")
    write_card(root / name, card)
    return root / name, card, x, pre


def write_card(path, card):
    with open(path, "w") as f:
        yaml.safe_dump(card, f, sort_keys=False)


def export(*args):
    return subprocess.run([sys.executable, str(SCRIPT), "--card", *map(str, args)], capture_output=True, text=True,
                          timeout=120)


def export_here(card, out=None):
    """The conversion in this process (no second PyTorch start): the package's path."""
    return export_model.export_card(argparse.Namespace(card=str(card), out=out and str(out)))


class ExportCard(unittest.TestCase):
    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="export_model_test."))

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def written(self, result):
        self.assertEqual(result.returncode, 0, result.stderr)
        path = Path(result.stdout.splitlines()[-1])  # the last line: the package's path and nothing else
        self.assertTrue(path.is_dir(), result.stdout)
        return path

    def check_torchscript(self, package, card_name, pre):
        card = yaml.safe_load((package / card_name).read_text())
        entry = card["weights"]["torchscript"]
        self.assertEqual(entry["parent"], "pytorch_state_dict")
        self.assertEqual(entry["sha256"], sha256(package / entry["source"]))
        self.assertEqual(entry["pytorch_version"], torch.__version__.split("+")[0])
        self.assertIn("pytorch_state_dict", card["weights"])  # the card's own weights stay
        for f in ("tiny_net.py", "state.pt", "test_input.npy", "test_output.npy", "README.md"):
            self.assertTrue((package / f).is_file(), f)
        model = torch.jit.load(str(package / entry["source"]))
        with torch.no_grad():
            got = sigmoid(model(torch.from_numpy(pre.astype(np.float32))).numpy().astype(np.float64))
        np.testing.assert_allclose(got, np.load(package / "test_output.npy"), rtol=1e-5, atol=1e-6)
        return card

    def test_a_05_package_gains_torchscript_weights_that_check_model_passes(self):
        card_path, _, _, pre = make_package(self.tmp / "tiny05", "0.5")
        package = self.written(export(self.tmp / "tiny05"))
        self.assertEqual(package, self.tmp / "tiny05.torchscript")  # beside the input
        card = self.check_torchscript(package, "bioimageio.yaml", pre)
        self.assertIn("scripted", card["weights"]["torchscript"]["comment"])
        if not TILER:
            self.skipTest("no tiler binary given: check-model not run")
        check = subprocess.run([TILER, "check-model", str(package)], capture_output=True, text=True,
                               timeout=120)
        self.assertEqual(check.returncode, 0, check.stdout + check.stderr)

    def test_a_04_card_with_per_sample_normalisation_is_converted(self):
        card_path, _, x, pre = make_package(self.tmp / "tiny04", "0.4")
        package = export_here(card_path)  # the card file itself
        self.assertEqual(package, self.tmp / "tiny04.torchscript")
        card = self.check_torchscript(package, "rdf.yaml", pre)
        self.assertEqual(card["format_version"], "0.4.10")
        self.assertEqual(card["timestamp"], "2024-01-01T00:00:00Z")  # a date stays the card's string

    def test_a_zip_is_read_in_a_temporary_directory_and_written_beside_it(self):
        _, _, _, pre = make_package(self.tmp / "pkg", "0.5")
        zip_path = self.tmp / "tiny.zip"
        with zipfile.ZipFile(zip_path, "w") as z:
            for f in sorted((self.tmp / "pkg").iterdir()):
                z.write(f, f.name)
        shutil.rmtree(self.tmp / "pkg")
        package = self.written(export(zip_path))
        self.assertEqual(package, self.tmp / "tiny.torchscript")
        self.check_torchscript(package, "bioimageio.yaml", pre)
        self.assertEqual(sorted(p.name for p in self.tmp.iterdir()), ["tiny.torchscript", "tiny.zip"])
        # A member's checksum mismatch names it inside the zip.
        card_path, card, _, _ = make_package(self.tmp / "pkg2", "0.4")
        card["weights"]["pytorch_state_dict"]["sha256"] = "0" * 64
        write_card(card_path, card)
        with zipfile.ZipFile(self.tmp / "bad.zip", "w") as z:
            for f in sorted((self.tmp / "pkg2").iterdir()):
                z.write(f, f.name)
        self.refused(self.tmp / "bad.zip", f"{self.tmp / 'bad.zip'}:state.pt: sha256")

    def test_an_unscriptable_architecture_is_traced_and_checked_at_tilers_window(self):
        _, _, _, pre = make_package(self.tmp / "traced", "0.5", "Unscriptable")
        package = export_here(self.tmp / "traced", self.tmp / "out")
        self.assertEqual(package, self.tmp / "out")
        card = self.check_torchscript(package, "bioimageio.yaml", pre)
        self.assertIn("traced", card["weights"]["torchscript"]["comment"])

    def test_a_trace_that_depends_on_the_input_size_is_refused(self):
        # The card's window {min 16, step 16} is 256 px for tiler; the test input is 32: the trace fixed the width.
        make_package(self.tmp / "sized", "0.5", "Untraceable")
        self.refused(self.tmp / "sized", "256x256", "traced model differs")
        self.assertFalse((self.tmp / "sized.torchscript").exists())

    def refused(self, card_path, *fragments):
        with self.assertRaises(export_model.CardError) as refusal:
            export_here(card_path)
        for fragment in fragments:
            self.assertIn(fragment, str(refusal.exception))

    def test_a_sha256_mismatch_names_the_file(self):
        card_path, card, _, _ = make_package(self.tmp / "p", "0.5")
        card["weights"]["pytorch_state_dict"]["sha256"] = "0" * 64
        write_card(card_path, card)
        result = export(card_path)  # as a user sees it: one line on stderr, exit 1, nothing on stdout
        self.assertEqual((result.returncode, result.stdout), (1, ""), result.stderr)
        for fragment in ("state.pt", "sha256", "weights.pytorch_state_dict.sha256"):
            self.assertIn(fragment, result.stderr)
        card_path, card, _, _ = make_package(self.tmp / "q", "0.4")
        card["weights"]["pytorch_state_dict"]["architecture_sha256"] = "1" * 64
        write_card(card_path, card)
        self.refused(card_path, "tiny_net.py", "sha256", "architecture_sha256")

    def test_an_architecture_outside_the_package_is_refused(self):
        card_path, card, _, _ = make_package(self.tmp / "p", "0.5")
        shutil.copy(self.tmp / "p/tiny_net.py", self.tmp / "x.py")
        card["weights"]["pytorch_state_dict"]["architecture"]["source"] = "../x.py"
        write_card(card_path, card)
        self.refused(card_path, "'../x.py'", "outside the package")
        card_path, card, _, _ = make_package(self.tmp / "q", "0.4")
        card["weights"]["pytorch_state_dict"]["architecture"] = "../x.py:TinyNet"
        write_card(card_path, card)
        self.refused(card_path, "'../x.py'", "outside the package")

    def test_a_missing_test_tensor_is_refused(self):
        card_path, card, _, _ = make_package(self.tmp / "p", "0.5")
        del card["inputs"][0]["test_tensor"]
        write_card(card_path, card)
        self.refused(card_path, "inputs[0].test_tensor is missing")
        card_path, card, _, _ = make_package(self.tmp / "q", "0.4")
        card["inputs"][0]["data_type"] = "float7"
        write_card(card_path, card)
        self.refused(card_path, "data_type 'float7'")
        card["inputs"][0]["data_type"] = "float32"
        write_card(card_path, card)
        os.remove(self.tmp / "q/test_output.npy")
        self.refused(card_path, "test_outputs[0]", "'test_output.npy'", "no such file")

    def test_an_output_off_the_test_output_is_refused_under_the_cards_tolerance(self):
        card_path, card, _, _ = make_package(self.tmp / "p", "0.5")
        y = np.load(self.tmp / "p/test_output.npy")
        y[0, 0, 3, 4] += 0.01  # one element of 1024: 977 per million, over the default 100
        np.save(self.tmp / "p/test_output.npy", y)
        card["outputs"][0]["test_tensor"]["sha256"] = sha256(self.tmp / "p/test_output.npy")
        write_card(card_path, card)
        self.refused(card_path, "1 of 1024 elements", "100 per million")
        card["config"] = {"bioimageio": {"reproducibility_tolerance": [
            {"weights_formats": ["onnx"], "mismatched_elements_per_million": 0},
            {"output_ids": ["prob"], "mismatched_elements_per_million": 1000}]}}
        write_card(card_path, card)
        export_here(card_path)

    def test_other_refusals_name_the_field(self):
        card_path, card, _, _ = make_package(self.tmp / "p", "0.5")
        steps = card["inputs"][0]["preprocessing"]
        card["inputs"][0]["preprocessing"] = [{"id": "fancy_norm"}]
        write_card(card_path, card)
        self.refused(card_path, "step 'fancy_norm'", "inputs[0] preprocessing")
        card["inputs"][0]["preprocessing"] = steps
        for version in (None, "0.3.6"):
            older = copy.deepcopy(card)
            older.pop("format_version") if version is None else older.update(format_version=version)
            write_card(card_path, older)
            self.refused(card_path, "format_version")
        state = card["weights"]["pytorch_state_dict"]
        url = copy.deepcopy(card)
        url["weights"]["pytorch_state_dict"]["source"] = "https://example.com/state.pt"
        write_card(card_path, url)
        self.refused(card_path, "weights.pytorch_state_dict.source is a URL")
        two = copy.deepcopy(card)
        two["inputs"].append(copy.deepcopy(two["inputs"][0]))
        write_card(card_path, two)
        self.refused(card_path, "inputs holds 2 tensors")
        done = copy.deepcopy(card)
        done["weights"]["torchscript"] = {"source": "state.pt"}
        write_card(card_path, done)
        self.refused(card_path, "weights.torchscript is given already")
        card["weights"]["pytorch_state_dict"] = state
        write_card(card_path, card)
        (self.tmp / "p.torchscript").mkdir()
        self.refused(card_path, "p.torchscript", "exists")

    def test_each_card_problem_is_refused_naming_it(self):
        card_path, base, _, _ = make_package(self.tmp / "p", "0.5")
        (self.tmp / "p/bad.py").write_text("raise ImportError('no such helper')\n")
        (self.tmp / "p/junk.pt").write_bytes(b"not a pickle")
        np.save(self.tmp / "p/small.npy", np.zeros((1, 1, 16, 16), np.float32))
        shutil.copy(self.tmp / "p/tiny_net.py", self.tmp / "x.py")
        os.symlink("../x.py", self.tmp / "p/link.py")

        def arch(**fields):
            return lambda c: c["weights"]["pytorch_state_dict"]["architecture"].update(fields)

        def pre(steps):
            return lambda c: c["inputs"][0].update(preprocessing=steps)

        cases = [
            (lambda c: c.update(type="dataset"), "type 'dataset' is not a model"),
            (lambda c: c.update(weights={"onnx": {"source": "m.onnx"}}), "weights has onnx"),
            (arch(callable="Nope"), "has no callable 'Nope'"),
            (arch(kwargs={"bogus": 1}), "building the architecture with the card's kwargs"),
            (arch(kwargs={"in_channels": 1, "out_channels": 1, "hidden": 5}),
             "state.pt: does not fit the architecture"),
            (arch(source="bad.py", sha256=None), "bad.py: importing the architecture failed: ImportError"),
            (arch(source="link.py", sha256=None), "through a symbolic link"),
            (arch(source=None, import_from="no_such_module_here"), "'no_such_module_here' does not import"),
            (arch(source=None, import_from="collections", callable="OrderedDict", kwargs={}),
             "collections.OrderedDict is neither a torch.nn.Module class nor a model builder"),
            (arch(source=None, import_from="shutil", callable="rmtree", kwargs={"path": str(self.tmp / "p")}),
             "shutil.rmtree is neither a torch.nn.Module class"),
            (lambda c: c["weights"]["pytorch_state_dict"].update(source="junk.pt", sha256=None),
             "junk.pt: not a state dict torch.load reads"),
            (lambda c: c["outputs"][0].update(test_tensor={"source": "small.npy"}), "test output is [1, 1, 16, 16]"),
            (pre([{"id": "ensure_dtype", "kwargs": {"dtype": "float7"}}]), "dtype 'float7'"),
            (pre([{"id": "clip", "kwargs": {}}]), "clip: neither min nor max"),
            (pre([{"id": "softmax", "kwargs": {"axis": "z"}}]), "softmax: axis 'z'"),
            (pre([{"id": "scale_range", "kwargs": {"reference_tensor": "other"}}]), "reference_tensor 'other'"),
            (pre([{"id": "scale_mean_variance", "kwargs": {"reference_tensor": "other"}}]), "reference_tensor 'other'"),
            (pre([{"id": "scale_linear", "kwargs": {"gain": "much"}}]), "'much' is not a number"),
            (pre(["scale_linear"]), "inputs[0].preprocessing holds a step that is not a mapping"),
            (lambda c: c["inputs"][0].update(axes="bcyx"), "inputs[0].axes is not a list of axes"),
        ]
        for change, fragment in cases:
            card = copy.deepcopy(base)
            change(card)
            write_card(card_path, card)
            with self.subTest(fragment=fragment):
                self.refused(card_path, fragment)
        card_path.write_text("- a list\n")
        self.refused(card_path, "not a YAML mapping")
        card_path.write_text("a: [unclosed\n")
        self.refused(card_path, "not a YAML model description")
        os.remove(card_path)
        self.refused(self.tmp / "p", "holds no rdf.yaml or bioimageio.yaml")
        write_card(self.tmp / "p/a.bioimageio.yaml", base)
        write_card(self.tmp / "p/b.bioimageio.yaml", base)
        self.refused(self.tmp / "p", "holds several cards (a.bioimageio.yaml, b.bioimageio.yaml)")
        self.refused(self.tmp / "nothing", "no such file or directory")

    def test_a_zip_member_leaving_the_package_is_refused(self):
        zip_path = self.tmp / "evil.zip"
        with zipfile.ZipFile(zip_path, "w") as z:
            z.writestr("rdf.yaml", "format_version: 0.5.4\n")
            z.writestr("../escaped.py", "print('no')\n")
        self.refused(zip_path, "'../escaped.py'", "outside the package")
        self.assertFalse((self.tmp.parent / "escaped.py").exists())
        with zipfile.ZipFile(zip_path, "w") as z:
            z.writestr("rdf.yaml", "format_version: 0.5.4\n")
            link = zipfile.ZipInfo("state.pt")
            link.external_attr = (0o120777 << 16)
            z.writestr(link, "/etc/passwd")
        self.refused(zip_path, "'state.pt' is a symbolic link")
        with zipfile.ZipFile(zip_path, "w") as z:
            z.writestr("rdf.yaml", "format_version: 0.5.4\n")
            z.writestr("state.pt", "a")
            with self.assertWarns(UserWarning):  # zipfile's own "Duplicate name"
                z.writestr("state.pt", "b")
        self.refused(zip_path, "'state.pt' is in the archive twice")
        with zipfile.ZipFile(zip_path, "w") as z:
            z.writestr("rdf.yaml", "format_version: 0.5.4\n")
            big = zipfile.ZipInfo("state.pt")
            z.writestr(big, "small")
        with zipfile.ZipFile(zip_path) as z:
            self.assertEqual(z.getinfo("state.pt").file_size, 5)
        old_bound = export_model.MAX_EXTRACTED_BYTES
        export_model.MAX_EXTRACTED_BYTES = 10
        try:
            with self.assertRaisesRegex(export_model.CardError, "over the 10 a model package is taken to hold"):
                export_model.extract_zip(zip_path, self.tmp / "bomb")
        finally:
            export_model.MAX_EXTRACTED_BYTES = old_bound
        self.assertFalse((self.tmp / "bomb").exists())

    def test_a_zip_with_its_package_in_one_top_folder_is_read(self):
        _, _, _, pre = make_package(self.tmp / "pkg", "0.5")
        zip_path = self.tmp / "top.zip"
        with zipfile.ZipFile(zip_path, "w") as z:
            for f in sorted((self.tmp / "pkg").iterdir()):
                z.write(f, "model/" + f.name)
        shutil.rmtree(self.tmp / "pkg")
        package = self.written(export(zip_path))
        self.check_torchscript(package, "bioimageio.yaml", pre)


class Steps(unittest.TestCase):
    """The spec's processing steps against numbers computed here, independently."""

    x = np.arange(2 * 3 * 4, dtype=np.float64).reshape(1, 2, 3, 4) ** 1.5  # batch, channel, y, x

    def run_steps(self, steps, version=(0, 5), dims=("batch", "channel", "y", "x"), x=None, reference=None):
        tensor = export_model.Tensor("raw", list(dims), None, None, steps)
        return export_model.apply_steps(self.x if x is None else x, tensor, version, "card", reference or {})

    def test_statistics_steps(self):
        x = self.x
        got = self.run_steps([("zero_mean_unit_variance", {"axes": ["y", "x"]})])
        for c in range(2):
            v = x[0, c]
            np.testing.assert_allclose(got[0, c], (v - v.mean()) / (np.sqrt(((v - v.mean()) ** 2).mean()) + 1e-6))
        whole = self.run_steps([("zero_mean_unit_variance", {})])
        np.testing.assert_allclose(whole.mean(), 0, atol=1e-9)
        np.testing.assert_allclose(whole.std(), 1, atol=1e-6)
        # 0.4: axes as letters, mode per_sample; mode fixed with per-channel numbers along the left-out axis.
        v04 = self.run_steps([("zero_mean_unit_variance", {"mode": "per_sample", "axes": "yx"})], version=(0, 4))
        np.testing.assert_allclose(v04, got)
        fixed = self.run_steps([("zero_mean_unit_variance", {"mode": "fixed", "axes": "yx", "mean": [1, 2],
                                                             "std": [3, 4]})], version=(0, 4))
        np.testing.assert_allclose(fixed[0, 1], (x[0, 1] - 2) / (4 + 1e-6))
        fixed05 = self.run_steps([("fixed_zero_mean_unit_variance", {"axis": "channel", "mean": [1, 2],
                                                                     "std": [3, 4]})])
        np.testing.assert_allclose(fixed05, fixed)
        # scale_range: percentiles per channel, linear interpolation between ranks; eps 1e-6.
        got = self.run_steps([("scale_range", {"axes": ["y", "x"], "min_percentile": 10, "max_percentile": 90})])
        v = np.sort(x[0, 1].ravel())  # 12 values: the 10th percentile lies at rank 1.1, the 90th at 9.9
        lo, hi = v[1] + 0.1 * (v[2] - v[1]), v[9] + 0.9 * (v[10] - v[9])
        np.testing.assert_allclose(got[0, 1], (x[0, 1] - lo) / (hi - lo + 1e-6))
        # scale_mean_variance: the output given the reference's mean and std.
        ref = np.full_like(x, 5.0) + np.arange(4)
        got = self.run_steps([("scale_mean_variance", {"reference_tensor": "raw", "axes": ["y", "x"]})],
                             reference={"raw": ref})
        np.testing.assert_allclose(got.mean(axis=(2, 3)), ref.mean(axis=(2, 3)))
        np.testing.assert_allclose(got.std(axis=(2, 3)), ref.std(axis=(2, 3)), rtol=1e-5)

    def test_pointwise_steps(self):
        x = self.x
        np.testing.assert_allclose(self.run_steps([("scale_linear", {"gain": 2, "offset": -1})]), 2 * x - 1)
        along = self.run_steps([("scale_linear", {"axis": "channel", "gain": [1, 10], "offset": [0, 1]})])
        np.testing.assert_allclose(along[0, 1], 10 * x[0, 1] + 1)
        np.testing.assert_allclose(along[0, 0], x[0, 0])
        np.testing.assert_allclose(self.run_steps([("clip", {"min": 3, "max": 50})]), np.minimum(np.maximum(x, 3), 50))
        self.assertTrue((self.run_steps([("binarize", {"threshold": 20})]) == (x > 20)).all())
        np.testing.assert_allclose(self.run_steps([("sigmoid", {})]), 1 / (1 + np.exp(-x)))
        soft = self.run_steps([("softmax", {"axis": "channel"})], x=x / 100)
        np.testing.assert_allclose(soft[0, 0], np.exp(x[0, 0] / 100) / np.exp(x[0] / 100).sum(axis=0))
        self.assertEqual(self.run_steps([("ensure_dtype", {"dtype": "float32"})]).dtype, np.float32)

    def test_a_card_reads_as_yaml_1_2(self):
        text = "eps: 1e-6\nbig: 1E+3\nwhen: 2024-01-01T00:00:00Z\nflag: no\non: yes\nyes: true\n"
        self.assertEqual(yaml.load(text, Loader=export_model.card_yaml_loader()),
                         {"eps": 1e-6, "big": 1000.0, "when": "2024-01-01T00:00:00Z", "flag": "no", "on": "yes",
                          "yes": True})

    def test_a_step_without_its_axis_is_refused(self):
        with self.assertRaisesRegex(export_model.CardError, "axes .'z'. are not the tensor's"):
            self.run_steps([("zero_mean_unit_variance", {"axes": ["z"]})])
        with self.assertRaisesRegex(export_model.CardError, "3 values along 'channel' of size 2"):
            self.run_steps([("scale_linear", {"axis": "channel", "gain": [1, 2, 3]})])


if __name__ == "__main__":
    unittest.main()
