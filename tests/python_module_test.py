"""The Python module `tiler` (python/): tiler.infer writes the command's bytes (segment, classify, instances) and
returns its report; tiler.predict on arrays in memory (uint8, uint16, float32; H x W x C and C x H x W) gives
the command's numbers on the same pixels saved as a TIFF, its outputs kept in memory (no file written); a Model
used twice; a bad flag's message and type; Ctrl-C in infer and finetune; two ranks under ctrun running a Python
script.
Usage: python_module_test.py MODULE_DIR TILER CTRUN (build/python, build/tiler, build/ctrun)."""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

try:
    import numpy as np
except ImportError:  # CMake's Python lacks NumPy: the one that has it (TILER_PYTHON, else Debian's) runs the test
    python = os.environ.get("TILER_PYTHON") or "/usr/bin/python3"
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        raise
    os.execv(python, [python, *sys.argv])

if len(sys.argv) >= 4:
    MODULE_DIR, TILER, CTRUN = sys.argv[1:4]
    del sys.argv[1:4]
else:
    MODULE_DIR, TILER, CTRUN = "build/python", "build/tiler", "build/ctrun"
sys.path.insert(0, MODULE_DIR)
import tiler  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "samples/models"
SMALL = str(ROOT / "samples/images/small.png")


def write_tiff(array, path):
    """`array` (H x W or H x W x C; uint8, uint16 or float32) as an uncompressed one-strip TIFF."""
    a = np.ascontiguousarray(array if array.ndim == 3 else array[..., None])
    h, w, c = a.shape
    bits = a.dtype.itemsize * 8
    data = a.tobytes()
    entries = []  # (tag, type, count, value bytes)

    def tag(code, kind, values):
        fmt = {3: "H", 4: "I"}[kind]
        entries.append((code, kind, len(values), struct.pack("<%d%s" % (len(values), fmt), *values)))

    tag(256, 4, [w])
    tag(257, 4, [h])
    tag(258, 3, [bits] * c)
    tag(259, 3, [1])
    tag(262, 3, [2 if c >= 3 else 1])
    tag(273, 4, [8])
    tag(277, 3, [c])
    tag(278, 4, [h])
    tag(279, 4, [len(data)])
    tag(284, 3, [1])
    if c in (2, 4):
        tag(338, 3, [2])
    tag(339, 3, [3 if a.dtype == np.float32 else 1] * c)
    ifd = 8 + len(data)
    extra = ifd + 2 + 12 * len(entries) + 4
    head, tail = b"", b""
    for code, kind, count, value in entries:
        if len(value) <= 4:
            head += struct.pack("<HHI", code, kind, count) + value.ljust(4, b"\0")
        else:
            head += struct.pack("<HHII", code, kind, count, extra + len(tail))
            tail += value
    with open(path, "wb") as f:
        f.write(b"II*\0" + struct.pack("<I", ifd) + data)
        f.write(struct.pack("<H", len(entries)) + head + struct.pack("<I", 0) + tail)


def command(*args):
    run = subprocess.run([TILER, *map(str, args)], capture_output=True, text=True)
    if run.returncode != 0:
        raise AssertionError("tiler %s: exit %d\n%s%s" % (args, run.returncode, run.stdout, run.stderr))
    return run


def outputs_of(directory):
    """Every file under `directory` but the report and the lock: relative path -> bytes."""
    found = {}
    for base, _, names in os.walk(directory):
        for name in names:
            if name in ("report.json", ".tiler.lock"):
                continue
            path = os.path.join(base, name)
            found[os.path.relpath(path, directory)] = Path(path).read_bytes()
    return found


def test_image(dtype, h=150, w=200, c=3, seed=0):
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    base = (np.sin(yy / 9.0) * np.cos(xx / 13.0) + 1) / 2
    pixels = np.stack([base * (0.6 + 0.2 * k) for k in range(c)], axis=-1) + rng.normal(0, 0.03, (h, w, c))
    pixels = np.clip(pixels, 0, 1)
    if dtype == np.uint8:
        return (pixels * 255).round().astype(np.uint8)
    if dtype == np.uint16:
        return (pixels * 65535).round().astype(np.uint16)
    return pixels.astype(np.float32)


class Infer(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="tiler-python-")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def same_bytes(self, model, flags, **keywords):
        """The command's outputs and tiler.infer's, for the same flags, are the same files with the same bytes."""
        by_command, by_python = os.path.join(self.dir, "command"), os.path.join(self.dir, "python")
        command("-i", SMALL, "-o", by_command, "-m", model, "--no_progress", *flags)
        report = tiler.infer(SMALL, by_python, model, no_progress=True, **keywords)
        expected, got = outputs_of(by_command), outputs_of(by_python)
        self.assertTrue(expected)
        self.assertEqual(sorted(expected), sorted(got))
        for name in expected:
            self.assertEqual(expected[name], got[name], name)
        with open(os.path.join(by_python, "report.json"), encoding="utf-8") as f:
            written = json.load(f)
        self.assertLessEqual(set(written), set(report))
        self.assertEqual(report["images"][0]["status"], "ok")
        self.assertEqual(report["exit_code"], 0)
        return report

    def test_segment_writes_the_commands_bytes(self):
        self.same_bytes(MODELS / "sample.pt", ["--window", "64", "--overlap", "0.25", "--save", "labels,probs"],
                        window=64, overlap=0.25, save=["labels", "probs"])

    def test_classify_writes_the_commands_bytes(self):
        report = self.same_bytes(MODELS / "classifier.pt", ["--task", "classify", "--window", "64", "--save", "csv"],
                                 task="classify", window=64, save="csv")
        self.assertEqual(report["task"], "classify")

    def test_instances_writes_the_commands_bytes(self):
        self.same_bytes(MODELS / "instances.pt", ["--task", "instances", "--window", "64", "--overlap", "0.5"],
                        task="instances", window=64, overlap=0.5)

    def test_the_engine_runs_as_the_commands_does(self):
        """The same job from the command and from Python (torch imported first with its own thread settings,
        where this Python has torch) takes the same layout: threads, replicas, read threads, BLAS; the
        engine's settings win over those Python's torch was given."""
        layout = ("threads", "replicas", "read_threads", "shard_run", "cpu_blas", "backend", "precision", "stitch")
        by_command = os.path.join(self.dir, "command")
        # One replica: its threads are the CPUs' (the light-model timing, which the load sways, is not asked).
        command("-i", SMALL, "-o", by_command, "-m", MODELS / "sample.pt", "--window", "64", "--replicas", "1",
                "--no_progress")
        with open(os.path.join(by_command, "report.json"), encoding="utf-8") as f:
            written = json.load(f)
        expected = {k: written[k] for k in layout}
        try:
            import torch  # noqa: F401
            prelude = "import torch; torch.set_num_threads(1); torch.set_num_interop_threads(1); "
        except ImportError:
            prelude = ""
        code = ("import json, sys; %ssys.path.insert(0, %r); import tiler; "
                "r = tiler.infer(%r, %r, %r, window=64, replicas=1, no_progress=True); "
                "print(json.dumps({k: r[k] for k in %r}))"
                % (prelude, os.path.abspath(MODULE_DIR), SMALL, os.path.join(self.dir, "python"),
                   str(MODELS / "sample.pt"), layout))
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertEqual(json.loads(run.stdout.splitlines()[-1]), expected)

    def test_a_bad_flag_is_a_value_error_with_the_commands_message(self):
        run = subprocess.run([TILER, "-i", SMALL, "-o", self.dir, "--windw", "64"], capture_output=True, text=True)
        self.assertEqual(run.returncode, 1)
        line = run.stderr.splitlines()[0]
        with self.assertRaises(ValueError) as caught:
            tiler.infer(SMALL, self.dir, windw=64)
        self.assertIsInstance(caught.exception, tiler.ConfigError)
        self.assertIsInstance(caught.exception, tiler.Error)
        self.assertEqual("tiler: error: " + str(caught.exception), line)
        self.assertIn("--windw", str(caught.exception))

    def test_a_bad_value_is_a_config_error_without_its_source_line(self):
        with self.assertRaises(tiler.ConfigError) as caught:
            tiler.infer(SMALL, self.dir, MODELS / "sample.pt", overlap=1.5)
        message = str(caught.exception)
        self.assertIn("1.5", message)
        self.assertNotIn(".cpp:", message)
        run = subprocess.run([TILER, "-i", SMALL, "-o", self.dir, "-m", str(MODELS / "sample.pt"), "--overlap", "1.5"],
                             capture_output=True, text=True)
        self.assertIn(message, run.stderr)

    def test_finetune_returns_its_report(self):
        out = os.path.join(self.dir, "tuned.pt")
        report = tiler.finetune(ROOT / "samples/train/images", out, MODELS / "init.pt",
                                labels=ROOT / "samples/train/labels", epochs=1, window=64, batch_size=4, threads=1,
                                val_fraction=0, no_progress=True)
        self.assertTrue(os.path.isfile(out))
        with open(out + ".report.json", encoding="utf-8") as f:
            self.assertLessEqual(set(json.load(f)), set(report))
        self.assertEqual(len(report["epochs"]), 1)
        with self.assertRaises(tiler.ConfigError) as caught:
            tiler.finetune(ROOT / "samples/train/images", out, epochs=0)
        self.assertIn("--epochs", str(caught.exception))

    def test_progress_sees_every_window(self):
        seen = []
        tiler.infer(SMALL, self.dir, MODELS / "sample.pt", window=64, progress=lambda done, total: seen.append((done, total)))
        self.assertTrue(seen)
        self.assertEqual(seen[-1][0], seen[-1][1])

    def test_a_tqdm_like_bar_is_told_every_window(self):
        class Bar:
            total, n = None, 0

            def update(self, k):
                self.n += k

        bar = Bar()
        report = tiler.infer(SMALL, self.dir, MODELS / "sample.pt", window=64, progress=bar)
        self.assertEqual(bar.total, report["windows_total"])
        self.assertEqual(bar.n, bar.total)

    def test_log_lines_go_to_pythons_logging(self):
        import logging

        with self.assertLogs("tiler", level="INFO") as logs:
            tiler.infer(SMALL, self.dir, MODELS / "sample.pt", window=64, no_progress=True)
        self.assertTrue(any("windows of 64x64" in line for line in logs.output), logs.output)

    def test_an_exception_in_progress_stops_the_run_and_is_raised(self):
        def stop(done, total):
            raise KeyboardInterrupt

        with self.assertRaises(KeyboardInterrupt):
            tiler.infer(SMALL, self.dir, MODELS / "sample.pt", window=32, batch_size=1, progress=stop)


    def interrupt_in_a_script(self, name, body, settle=0.0):
        """Runs BODY (after `import sys, time, tiler`) as a script, which prints 'started' once its call is under
        way and 'interrupted' with time.monotonic() on KeyboardInterrupt; SIGINT `settle` s after 'started':
        the script ends normally, interrupted within 5 s of the signal."""
        import signal
        import time
        script = os.path.join(self.dir, name)
        with open(script, "w", encoding="utf-8") as f:
            f.write("import sys, time\nsys.path.insert(0, %r)\nimport tiler\n" % os.path.abspath(MODULE_DIR) + body)
        run = subprocess.Popen([sys.executable, script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.assertEqual(run.stdout.readline().strip(), "started")
        time.sleep(settle)
        sent = time.monotonic()
        run.send_signal(signal.SIGINT)
        stdout, stderr = run.communicate(timeout=60)
        self.assertEqual(run.returncode, 0, stderr)
        words = stdout.split()
        self.assertIn("interrupted", words, stdout + stderr)
        self.assertLess(float(words[words.index("interrupted") + 1]) - sent, 5.0)

    def test_ctrl_c_raises_keyboard_interrupt_within_5_s(self):
        """SIGINT while the engine runs (GIL released): KeyboardInterrupt from tiler.infer once the step in
        flight ends, the lock and partial files gone."""
        out = os.path.join(self.dir, "long")
        self.interrupt_in_a_script("long.py",
                                   "def started(done, total):\n"
                                   "    if done <= 8:\n"
                                   "        print('started', flush=True)\n"
                                   "try:\n"
                                   "    tiler.infer(%r, %r, %r, threads=1, batch_size=8, progress=started)\n"
                                   "except KeyboardInterrupt:\n"
                                   "    print('interrupted', time.monotonic(), flush=True)\n"
                                   % (str(ROOT / "samples/images/blobs_4096.tif"), out, str(MODELS / "sample.pt")))
        left = os.listdir(out) if os.path.isdir(out) else []
        self.assertEqual([name for name in left if name.endswith(".partial") or name == ".tiler.lock"], [], left)

    def test_ctrl_c_during_set_up_stops_before_any_window(self):
        """An interrupt while the model loads (a timer's, 10 ms into the call): KeyboardInterrupt at the next
        phase's check, before the windows are dealt (their log line) and with no lock or partial file left."""
        import logging
        import signal

        lines = []

        class Keep(logging.Handler):
            def emit(self, record):
                lines.append(record.getMessage())

        def interrupt(signum, frame):
            raise KeyboardInterrupt

        logger, handler = logging.getLogger("tiler"), Keep()
        level = logger.level
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        previous = signal.signal(signal.SIGALRM, interrupt)
        try:
            signal.setitimer(signal.ITIMER_REAL, 0.01)
            with self.assertRaises(KeyboardInterrupt):
                tiler.infer(SMALL, self.dir, MODELS / "sample.pt", window=32, batch_size=1, no_progress=True)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
            logger.removeHandler(handler)
            logger.setLevel(level)
        self.assertEqual([line for line in lines if "windows of" in line], [], lines)
        self.assertEqual([n for n in os.listdir(self.dir) if n.endswith(".partial") or n == ".tiler.lock"], [])

    def test_ctrl_c_stops_finetune_within_5_s(self):
        """SIGINT while tiler.finetune trains (GIL released): KeyboardInterrupt within 5 s, the checkpoint
        directory's lock gone, no partial file and no model written."""
        out = os.path.join(self.dir, "tuned.pt")
        checkpoints = os.path.join(self.dir, "checkpoints")
        self.interrupt_in_a_script(
            "train.py",
            "import logging\n"
            "class Started(logging.Handler):\n"
            "    def emit(self, record):\n"
            "        if record.getMessage().startswith('finetune: '):\n"
            "            print('started', flush=True)\n"
            "logging.getLogger('tiler').addHandler(Started())\n"
            "logging.getLogger('tiler').setLevel(logging.INFO)\n"
            "try:\n"
            "    tiler.finetune(%r, %r, %r, labels=%r, epochs=1000, window=64, batch_size=2, threads=1,\n"
            "                   val_fraction=0, checkpoint_dir=%r, no_progress=True)\n"
            "except KeyboardInterrupt:\n"
            "    print('interrupted', time.monotonic(), flush=True)\n"
            % (str(ROOT / "samples/train/images"), out, str(MODELS / "init.pt"), str(ROOT / "samples/train/labels"),
               checkpoints),
            settle=0.5)  # training steps under way
        left = sorted(os.listdir(self.dir)) + sorted(os.listdir(checkpoints) if os.path.isdir(checkpoints) else [])
        self.assertNotIn("tuned.pt", left)  # the model is written when training ends
        self.assertEqual([n for n in left if n.endswith(".partial") or n == ".tiler.lock"], [], left)


class Predict(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="tiler-predict-")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def command_outputs(self, pixels, name, flags):
        """The output directory of `tiler infer` on `pixels` saved as a TIFF (uncompressed outputs, read here)."""
        path = os.path.join(self.dir, name + ".tif")
        write_tiff(pixels, path)
        out = os.path.join(self.dir, name)
        command("-i", path, "-o", out, "-m", MODELS / "sample.pt", "--no_progress", "--save", "labels,probs",
                "--compression", "none", *flags)
        return out

    def check(self, pixels, name, layout="", given=None):
        out = self.command_outputs(pixels, name, ["--window", "64", "--overlap", "0.25"])
        result = tiler.predict(pixels if given is None else given, MODELS / "sample.pt", window=64, overlap=0.25,
                               layout=layout, save="labels,probs")
        h, w = pixels.shape[:2]
        self.assertEqual(result["labels"].shape, (h, w))
        self.assertEqual(result["probs"].dtype, np.float32)
        self.assertEqual(result["probs"].shape[1:], (h, w))
        labels = read_raw_tiff(os.path.join(out, name + "_labels.tif"))
        probs = read_raw_tiff(os.path.join(out, name + "_probs.tif"))
        self.assertEqual(result["labels"].tobytes(), labels.reshape(h, w).tobytes())
        np.testing.assert_array_equal(result["probs"], np.moveaxis(probs, -1, 0))

    def test_uint8_hwc(self):
        self.check(test_image(np.uint8), "u8")

    def test_uint16_hwc(self):
        self.check(test_image(np.uint16), "u16")

    def test_float32_hwc(self):
        self.check(test_image(np.float32), "f32")

    def test_chw_by_its_shape_and_by_layout(self):
        pixels = test_image(np.uint8, seed=3)
        chw = np.ascontiguousarray(np.moveaxis(pixels, -1, 0))
        self.check(pixels, "chw", given=chw)
        self.check(pixels, "chw_layout", layout="chw", given=chw)
        # A strided view (no copy) reads the same pixels.
        self.check(pixels, "view", given=np.moveaxis(chw, 0, -1))

    def test_a_model_loaded_once_predicts_twice(self):
        model = tiler.Model(MODELS / "sample.pt", window=64, overlap=0.25)
        first = model.predict(test_image(np.uint8, seed=1))
        second = model.predict(test_image(np.uint8, seed=2))
        again = model.predict(test_image(np.uint8, seed=1))
        self.assertEqual(first["labels"].tobytes(), again["labels"].tobytes())
        self.assertNotEqual(first["labels"].tobytes(), second["labels"].tobytes())
        for result in (first, second, again):
            self.assertEqual(result["report"]["window"], [64, 64])
        self.assertEqual(model.flags, {"window": 64, "overlap": 0.25})
        self.assertEqual(model.loads, 1)
        with tempfile.TemporaryDirectory() as d:  # the command's numbers, loading the model every time
            path = os.path.join(d, "image.tif")
            write_tiff(test_image(np.uint8, seed=2), path)
            out = os.path.join(d, "out")
            command("-i", path, "-o", out, "-m", MODELS / "sample.pt", "--window", "64", "--no_progress",
                    "--compression", "none")
            labels = read_raw_tiff(os.path.join(out, "image_labels.tif"))
            self.assertEqual(second["labels"].tobytes(), labels.tobytes())
        # Another window is another model as the engine probes it: made anew.
        self.assertEqual(model.predict(test_image(np.uint8, seed=1), window=32)["report"]["window"], [32, 32])
        self.assertEqual(model.loads, 2)

    def test_torch_imported_first_shares_the_process(self):
        """Debian's python3-torch and tiler share one LibTorch: importing both gives the same numbers."""
        try:
            import torch  # noqa: F401
        except ImportError:
            self.skipTest("no torch in this Python")
        path = os.path.join(self.dir, "pixels.npy")
        np.save(path, test_image(np.uint8, seed=5))
        code = ("import sys, numpy as np, torch; sys.path.insert(0, %r); import tiler; "
                "r = tiler.predict(np.load(%r), %r, window=64, save='probs'); "
                "sys.stdout.buffer.write(r['probs'].tobytes())" % (os.path.abspath(MODULE_DIR), path,
                                                                    str(MODELS / "sample.pt")))
        run = subprocess.run([sys.executable, "-c", code], capture_output=True)
        self.assertEqual(run.returncode, 0, run.stderr)
        ours = tiler.predict(np.load(path), MODELS / "sample.pt", window=64, save="probs")["probs"]
        self.assertEqual(run.stdout, ours.tobytes())

    def test_a_bad_dtype_is_refused(self):
        with self.assertRaises(ValueError) as caught:
            tiler.predict(np.zeros((8, 8, 3), np.int32), MODELS / "sample.pt")
        self.assertIn("int32", str(caught.exception))

    def test_objects_are_the_commands_for_an_object_task(self):
        pixels = test_image(np.uint8)
        path = os.path.join(self.dir, "objects.tif")
        write_tiff(pixels, path)
        out = os.path.join(self.dir, "objects")
        flags = ["--window", "64", "--overlap", "0.5", "--task", "instances", "--save", "objects,objects_csv"]
        command("-i", path, "-o", out, "-m", MODELS / "instances.pt", "--no_progress", *flags)
        result = tiler.predict(pixels, MODELS / "instances.pt", window=64, overlap=0.5, task="instances",
                               save="objects,objects_csv")
        self.assertEqual(result["objects"]["type"], "FeatureCollection")
        self.assertTrue(result["objects"]["features"])
        with open(os.path.join(out, "objects_objects.geojson"), encoding="utf-8") as f:
            self.assertEqual(result["objects"], json.load(f))
        self.assertEqual(result["objects_csv"], Path(out, "objects_objects.csv").read_text(encoding="utf-8"))

    def test_predict_writes_no_file(self):
        """The outputs and the report stay in memory: no scratch directory, no lock, nothing in the working
        directory."""
        with tempfile.TemporaryDirectory() as work, tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(self.dir, "pixels.npy")
            np.save(path, test_image(np.uint8, seed=4))
            code = ("import sys, numpy as np; sys.path.insert(0, %r); import tiler; "
                    "r = tiler.predict(np.load(%r), %r, window=64, save='labels,probs'); "
                    "assert r['labels'].shape == (150, 200) and r['probs'].shape == (2, 150, 200), r.keys(); "
                    "assert r['report']['images'][0]['status'] == 'ok', r['report']"
                    % (os.path.abspath(MODULE_DIR), path, str(MODELS / "sample.pt")))
            run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=work,
                                 env=dict(os.environ, TMPDIR=tmp))
            self.assertEqual(run.returncode, 0, run.stderr)
            self.assertEqual(os.listdir(work), [])
            self.assertEqual(os.listdir(tmp), [])

    def test_arrays_own_their_memory(self):
        """The returned arrays are NumPy's own (their buffers freed with them), writable, and a second predict
        gives new ones."""
        first = tiler.predict(test_image(np.uint8), MODELS / "sample.pt", window=64, save="labels,probs")
        second = tiler.predict(test_image(np.uint8), MODELS / "sample.pt", window=64, save="labels,probs")
        for kind in ("labels", "probs"):
            self.assertTrue(first[kind].flags.c_contiguous and first[kind].flags.writeable)
            self.assertFalse(np.shares_memory(first[kind], second[kind]))
            np.testing.assert_array_equal(first[kind], second[kind])

    def test_a_format_not_kept_in_memory_is_refused(self):
        with self.assertRaises(tiler.ConfigError) as caught:
            tiler.predict(test_image(np.uint8), MODELS / "sample.pt", window=64, save="labels,zarr")
        self.assertIn("--save zarr", str(caught.exception))
        with self.assertRaises(ValueError) as caught:
            tiler.predict(test_image(np.uint8), MODELS / "sample.pt", window=64, output=self.dir)
        self.assertIn("memory", str(caught.exception))

    def test_u8_probabilities_are_the_commands(self):
        pixels = test_image(np.uint8, seed=6)
        out = self.command_outputs(pixels, "probs_u8", ["--window", "64", "--probs_dtype", "u8"])
        result = tiler.predict(pixels, MODELS / "sample.pt", window=64, save="labels,probs", probs_dtype="u8")
        self.assertEqual(result["probs"].dtype, np.uint8)
        probs = read_raw_tiff(os.path.join(out, "probs_u8_probs.tif"))
        self.assertEqual(result["probs"].tobytes(), np.ascontiguousarray(np.moveaxis(probs, -1, 0)).tobytes())


def read_raw_tiff(path):
    """A one-page uncompressed TIFF tiler wrote (tiled or stripped), as H x W x C."""
    data = Path(path).read_bytes()
    assert data[:2] == b"II"
    big = struct.unpack_from("<H", data, 2)[0] == 43
    if big:
        offset = struct.unpack_from("<Q", data, 8)[0]
        count = struct.unpack_from("<Q", data, offset)[0]
        entry, size, first = 20, 8, offset + 8
    else:
        offset = struct.unpack_from("<I", data, 4)[0]
        count = struct.unpack_from("<H", data, offset)[0]
        entry, size, first = 12, 4, offset + 2
    sizes = {1: 1, 3: 2, 4: 4, 16: 8, 12: 8, 11: 4}
    fmt = {1: "B", 3: "H", 4: "I", 16: "Q", 12: "d", 11: "f"}
    tags = {}
    for k in range(count):
        at = first + k * entry
        code, kind = struct.unpack_from("<HH", data, at)
        n = struct.unpack_from("<Q" if big else "<I", data, at + 4)[0]
        where = at + 4 + size
        if n * sizes.get(kind, 1) > size:
            where = struct.unpack_from("<Q" if big else "<I", data, where)[0]
        if kind in fmt:
            tags[code] = struct.unpack_from("<%d%s" % (n, fmt[kind]), data, where)
    w, h = tags[256][0], tags[257][0]
    c = tags.get(277, (1,))[0]
    bits = tags[258][0]
    sample_format = tags.get(339, (1,))[0]
    assert tags.get(259, (1,))[0] == 1, "compressed"
    dtype = {(8, 1): np.uint8, (16, 1): np.uint16, (32, 3): np.float32, (32, 1): np.uint32}[(bits, sample_format)]
    out = np.zeros((h, w, c), dtype)
    if 322 in tags:
        tw, th = tags[322][0], tags[323][0]
        offsets, counts = tags[324], tags[325]
        across = (w + tw - 1) // tw
        for i, (o, n) in enumerate(zip(offsets, counts)):
            tile = np.frombuffer(data, dtype, th * tw * c, o).reshape(th, tw, c)
            y, x = (i // across) * th, (i % across) * tw
            out[y:y + th, x:x + tw] = tile[: min(th, h - y), : min(tw, w - x)]
    else:
        rows = tags.get(278, (h,))[0]
        for i, o in enumerate(tags[273]):
            y = i * rows
            n = min(rows, h - y)
            out[y:y + n] = np.frombuffer(data, dtype, n * w * c, o).reshape(n, w, c)
    return out


class Ranks(unittest.TestCase):
    def test_two_ranks_under_ctrun_write_the_one_rank_bytes(self):
        d = tempfile.mkdtemp(prefix="tiler-ranks-")
        try:
            script = os.path.join(d, "job.py")
            with open(script, "w", encoding="utf-8") as f:
                f.write(
                    "import json, os, sys\n"
                    "sys.path.insert(0, %r)\n"
                    "import tiler\n"
                    "report = tiler.infer(%r, %r, %r, window=64, no_progress=True)\n"
                    "if os.environ['RANK'] == '0':\n"
                    "    assert report['world_size'] == 2, report.get('world_size')\n"
                    "else:\n"
                    "    assert report is None\n" % (os.path.abspath(MODULE_DIR), SMALL, os.path.join(d, "two"),
                                                     str(MODELS / "sample.pt")))
            run = subprocess.run([CTRUN, "--nproc_per_node", "2", sys.executable, script], capture_output=True,
                                 text=True, timeout=240)
            self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
            command("-i", SMALL, "-o", os.path.join(d, "one"), "-m", MODELS / "sample.pt", "--window", "64",
                    "--no_progress")
            one, two = outputs_of(os.path.join(d, "one")), outputs_of(os.path.join(d, "two"))
            self.assertTrue(one)
            self.assertEqual(one, two)
        finally:
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
