#!/usr/bin/env python3
"""tiler's benchmarks: one row of BENCHES a bench (its name, what it measures, how it runs, what it reports).

  scripts/bench.py [--quick] [NAME ...]   run the named benches (default: all, the rows marked so), in table order
  scripts/bench.py --list                 the rows, one a line; --list NAME: one row in full
  scripts/bench.sh ...                    the same (it execs this file)

Each bench makes its own deterministic inputs (cached in $TILER_BENCH_CACHE, default ~/.cache/tiler-bench), runs
its scenarios $RUNS times (3; --quick: 1 run on small inputs), and appends one line a figure to
$BENCH_RESULTS/lines.jsonl (default bench-results/); the end writes $BENCH_RESULTS/bench.json (per scenario and
metric: median, min, max, runs; and the machine) and prints the same as a table. A paired ratio (tiler against
the pure forward, 2 ranks against 1, ...) is computed inside each run, then summarised like any figure. fp32 on
the CPU unless a row says otherwise. CI measures nothing: tests/bench_test.py runs --list and `--quick ctrun io`.

Environment: TILER_BUILD_DIR (an existing build, as scripts/gpu-build.sh's; otherwise this builds build/),
RUNS, TILER_BENCH_CACHE, BENCH_RESULTS, CODECS (the --compression values `codecs` tries), RUNTIMES_DEVICE
(`runtimes`: cpu or cuda), GPU_BENCH_SIZE and GPU_BENCH_IMAGES (`gpu`).

Python's standard library only: it runs with Debian's /usr/bin/python3. The Python yardsticks
(scripts/python_forward.py, python_finetune.py) run under /usr/bin/python3 when it imports torch (Debian's
python3-torch: the same LibTorch as tiler's); `gpu` and `runtimes` use the python3 on PATH (PyTorch's).

Exit status: 0; 1 when a bench failed or a figure could not be read (the figures that were read are still
written); 2 for an unknown bench name.
"""
import argparse
import functools
import glob
import json
import math
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
DEBIAN_PYTHON = "/usr/bin/python3"


class BenchError(Exception):
    """A command a bench runs failed: the bench stops, the others go on."""


def lookup(doc, key):
    """Every number under `key` anywhere in a parsed JSON document, in the order the text has them."""
    if isinstance(doc, dict):
        for k, v in doc.items():
            if k == key and isinstance(v, (int, float)) and not isinstance(v, bool):
                yield v
            else:
                yield from lookup(v, key)
    elif isinstance(doc, list):
        for v in doc:
            yield from lookup(v, key)


def field(doc, key, n=1):
    """The n-th number named `key` in the document (1: the first), or None."""
    values = list(lookup(doc, key))
    return values[n - 1] if len(values) >= n else None


def total(doc, key):
    values = list(lookup(doc, key))
    return sum(values) if values else None


def largest(doc, key):
    values = list(lookup(doc, key))
    return max(values) if values else None


def ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return round(a / b, 4)


def plus(*values):
    return None if any(v is None for v in values) else sum(values)


def parse_json_line(text, key):
    """The first line of a program's output that is a JSON object holding `key` (tiler_bench, python_forward;
    under ctrun after its "[rank N]: " prefix)."""
    for line in text.splitlines():
        start = line.find("{")
        if start < 0:
            continue
        try:
            doc = json.loads(line[start:])
        except json.JSONDecodeError:
            continue
        if isinstance(doc, dict) and key in doc:
            return doc
    return {}


def apparent_bytes(directory):
    """Bytes a job wrote (files and directories, apparent sizes, as `du -sb`), its report.json left out."""
    n = os.lstat(directory).st_size
    for parent, dirs, files in os.walk(directory):
        for name in dirs + files:
            if name != "report.json":
                n += os.lstat(os.path.join(parent, name)).st_size
    return n


def files_written(directory):
    return sum(1 for _, _, files in os.walk(directory) for f in files if f != "report.json")


class Bench:
    """What every row works with: the binaries, the cache, the inputs, and the figures it emits."""

    def __init__(self, bin_dir, cache, results, quick, runs):
        self.bin = Path(bin_dir)
        self.cache = Path(cache)
        self.results = Path(results)
        self.quick = quick
        self.runs = runs
        self.model = str(ROOT / "samples/models/sample.pt")
        self.cores = len(os.sched_getaffinity(0))
        self.lines = open(self.results / "lines.jsonl", "w", encoding="utf-8")
        self.figures = []
        self.missing = []

    # --- figures

    def emit(self, scenario, metric, value):
        if value is None or not math.isfinite(float(value)):
            print(f"bench: no figure for '{scenario}' {metric}", file=sys.stderr)
            self.missing.append((scenario, metric))
            return
        line = {"scenario": scenario, "metric": metric, "value": value}
        self.figures.append(line)
        self.lines.write(json.dumps(line) + "\n")
        self.lines.flush()

    def machine(self):
        meminfo = Path("/proc/meminfo").read_text()
        mem_kb = next(int(l.split()[1]) for l in meminfo.splitlines() if l.startswith("MemTotal"))
        cpu = next((l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines()
                    if l.startswith("model name")), "")
        version = self.output([self.tool("tiler"), "--version"])
        libtorch = next((l.split(":", 1)[1].strip() for l in version.splitlines() if l.startswith("LibTorch:")), "")
        machine = {"cores": self.cores, "memory_gb": round(mem_kb / 1048576), "cpu": cpu, "libtorch": libtorch}
        self.lines.write(json.dumps({"machine": machine}) + "\n")
        return machine

    # --- commands

    def tool(self, name):
        return str(self.bin / name)

    def tiler(self, *args):
        return [self.tool("tiler"), *map(str, args)]

    def ctrun(self, nproc, *program):
        return [self.tool("ctrun"), "--nproc_per_node", str(nproc), "--master_port", "0", *map(str, program)]

    def tiler_bench(self, *args):
        return [self.tool("tiler_bench"), *map(str, args)]

    def _fail(self, cmd, rc, log):
        tail = "".join(Path(log).read_text(errors="replace").splitlines(True)[-10:]) if log else ""
        raise BenchError(f"exit {rc}: {' '.join(map(str, cmd))}\n{tail}")

    def timed(self, cmd, env=None, check=True):
        """Runs cmd, its output to a log in the cache: (wall seconds, CPU seconds of it and every process it
        waited for, such as ctrun's ranks)."""
        log = self.cache / "last-command.log"
        t0 = time.monotonic()
        with open(log, "w") as out:
            p = subprocess.Popen(list(map(str, cmd)), stdout=out, stderr=subprocess.STDOUT,
                                 env=self.env(env), cwd=ROOT)
            _, status, usage = os.wait4(p.pid, 0)
        wall = time.monotonic() - t0
        p.returncode = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status)
        if check and p.returncode != 0:
            self._fail(cmd, p.returncode, log)
        return wall, usage.ru_utime + usage.ru_stime

    def wall(self, cmd, env=None):
        return self.timed(cmd, env)[0]

    def output(self, cmd, env=None, merge=True):
        """Runs cmd and returns its stdout (with its stderr when merge; apart, the stderr shows only if it fails)."""
        p = subprocess.run(list(map(str, cmd)), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT if merge else subprocess.PIPE, text=True, env=self.env(env),
                           cwd=ROOT)
        if p.returncode != 0:
            log = self.cache / "last-command.log"
            log.write_text((p.stdout or "") + (p.stderr or ""))
            self._fail(cmd, p.returncode, log)
        return p.stdout

    def json_out(self, cmd, key, env=None):
        """The JSON line holding `key` that cmd prints (tiler_bench's modes, the Python yardsticks)."""
        return parse_json_line(self.output(cmd, env, merge=False), key)

    @staticmethod
    def env(extra):
        if not extra:
            return None
        env = dict(os.environ)
        env.update(extra)
        return env

    def peak_rss_split(self, cmd):
        """Runs cmd, sampling its /proc status every 50 ms: (peak anonymous MB, peak file-page MB: the two that
        VmHWM adds up). A failed run shows as a missing report, not here."""
        p = subprocess.Popen(list(map(str, cmd)), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
        anon = file = 0
        while p.poll() is None:
            try:
                for line in Path(f"/proc/{p.pid}/status").read_text().splitlines():
                    if line.startswith("RssAnon:"):
                        anon = max(anon, int(line.split()[1]))
                    elif line.startswith("RssFile:"):
                        file = max(file, int(line.split()[1]))
            except (OSError, ValueError):
                pass  # the process ended between the test and the read
            time.sleep(0.05)
        return anon // 1024, file // 1024

    # --- inputs and outputs

    def fresh(self, name):
        """An output directory in the cache, emptied."""
        d = self.cache / name
        shutil.rmtree(d, ignore_errors=True)
        return d

    @staticmethod
    def report(path):
        try:
            return json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError):
            return {}

    def image(self, size):
        """A cached square RGB tiled deflate TIFF of size px."""
        f = self.cache / f"rgb_{size}.tif"
        if not f.exists():
            self.output(self.tiler_bench("make", f, "--size", size))
        return f

    def made(self, path, *make_args):
        """A cached input, made by `tiler_bench MODE PATH ARGS...` (make_args: MODE ARGS...) when missing."""
        if not Path(path).exists():
            self.output(self.tiler_bench(make_args[0], path, *make_args[1:]))
        return Path(path)

    @functools.cached_property
    def tiny(self):
        """The null model: one 1x1 convolution whose forward costs next to nothing."""
        return self.made(self.cache / "tiny.pt", "tiny-model")

    @functools.cached_property
    def unet2(self):
        """Issue 74's CPU yardstick: a 2-level UNet (3 -> 2 channels, 16 base, 117 k parameters), random weights
        of seed 0, scripted by Debian's python3 (scripts/make_unet.py); None where it has no torch."""
        path = self.cache / "unet2.pt"
        if not path.exists() and self.debian_python_has("torch"):
            self.output([DEBIAN_PYTHON, "scripts/make_unet.py", path, "--levels", 2])
        return path if path.exists() else None

    @property
    def sample(self):
        """The pipeline's input: the bundled 4096 px blobs (441 windows), or 1024 px with --quick (25 windows)."""
        return self.image(1024) if self.quick else ROOT / "samples/images/blobs_4096.tif"

    @property
    def pipeline_windows(self):
        return 25 if self.quick else 441  # 256 px windows, 25% overlap

    def size(self, full, quick):
        return quick if self.quick else full

    @functools.lru_cache(maxsize=None)
    def debian_python_has(self, module):
        """Whether Debian's python3 imports `module` (python3-torch: the same LibTorch as tiler's)."""
        return subprocess.run([DEBIAN_PYTHON, "-c", f"import {module}"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL).returncode == 0

    def python_forward(self, *args):
        return self.json_out([DEBIAN_PYTHON, "scripts/python_forward.py", *args], "seconds")

    def repeat(self):
        return range(self.runs)


# --- the benches, in the order `all` runs them


def bench_model(b):
    for batch in (1, 4, 8, 16):
        for precision in ("fp32", "bf16"):
            for _ in b.repeat():
                out = b.json_out(b.tiler_bench("forward", "-m", b.model, "--batch_size", batch, "--precision",
                                               precision, "--windows", 64, "--threads", 2), "windows_per_second")
                b.emit(f"model: forward batch {batch} {precision}", "windows_per_second",
                       out.get("windows_per_second"))


def bench_light(b):
    for _ in b.repeat():
        for threads, batch in ((1, 8), (2, 8), (1, 16)):
            args = ["-m", b.tiny, "--windows", 160, "--threads", threads, "--batch_size", batch]
            out = b.json_out(b.tiler_bench("forward", *args), "windows_per_second")
            name = f"light: null model forward, {threads} thread(s), batch {batch}"
            b.emit(f"{name}, C++", "windows_per_second", out.get("windows_per_second"))
            if b.debian_python_has("torch"):
                out = b.python_forward(*args)
                b.emit(f"{name}, Python", "windows_per_second", out.get("windows_per_second"))


def bench_pipeline(b):
    n, sample, model = b.pipeline_windows, b.sample, b.model
    for _ in b.repeat():
        pure = b.json_out(b.tiler_bench("forward", "-m", model, "--windows", n, "--threads", 2), "seconds")
        pure = pure.get("seconds")
        out = b.fresh("out_pipeline")
        e2e = b.wall(b.tiler("-i", sample, "-m", model, "-o", out, "--threads", 2, "--no_progress"))
        b.emit(f"pipeline: pure forward ({n} windows)", "seconds", pure)
        b.emit("pipeline: tiler 1 rank x 2 threads", "seconds", e2e)
        b.emit("pipeline: tiler / pure forward", "overhead_ratio", ratio(e2e, pure))
        # The same job with default flags, against the pure forward in its own layout (C++) and in Python.
        out = b.fresh("out_pipeline")
        default = b.wall(b.tiler("-i", sample, "-m", model, "-o", out, "--no_progress"))
        r = b.report(out / "report.json")
        replicas, threads = field(r, "replicas"), field(r, "threads")
        b.emit("pipeline: tiler 1 rank, default flags", "seconds", default)
        b.emit("pipeline: tiler 1 rank, default flags", "replicas", replicas)
        b.emit("pipeline: tiler 1 rank, default flags", "threads_per_replica", threads)
        stage_table(b, r, default)
        layout = b.json_out(b.tiler_bench("forward", "-m", model, "--windows", n, "--replicas", replicas,
                                          "--threads", threads), "seconds").get("seconds")
        b.emit("pipeline: pure forward in tiler's default layout", "seconds", layout)
        b.emit("pipeline: tiler default flags / pure forward in its layout", "overhead_ratio", ratio(default, layout))
        # The default freeze + optimize_for_inference (--jit_optimize) against the model as loaded.
        optimized = default if r.get("jit_optimize") else None
        out = b.fresh("out_pipeline")
        plain = b.wall(b.tiler("-i", sample, "-m", model, "-o", out, "--no_progress", "--no_jit_optimize"))
        b.emit("pipeline: tiler 1 rank, default flags, --no_jit_optimize", "seconds", plain)
        b.emit("pipeline: tiler default flags (optimised) / --no_jit_optimize", "time_ratio", ratio(optimized, plain))
        if b.debian_python_has("torch"):
            py = b.python_forward("-m", model, "--windows", n, "--threads", 2).get("seconds")
            b.emit(f"pipeline: pure forward in Python, 2 threads ({n} windows)", "seconds", py)
            b.emit("pipeline: tiler default flags / Python pure forward", "overhead_ratio", ratio(default, py))
            b.emit("pipeline: tiler 1 rank x 2 threads / Python pure forward", "overhead_ratio", ratio(e2e, py))
            pyopt = b.python_forward("-m", model, "--windows", n, "--threads", 2, "--optimize").get("seconds")
            b.emit("pipeline: pure forward in Python, 2 threads, frozen + optimize_for_inference", "seconds", pyopt)
            b.emit("pipeline: tiler default flags (optimised) / Python frozen pure forward", "overhead_ratio",
                   ratio(optimized, pyopt))
            b.emit("pipeline: Python frozen / Python as loaded", "time_ratio", ratio(pyopt, py))
        # The same whole process against Python's forward with a model whose forward costs more a window.
        if b.unet2:
            out = b.fresh("out_pipeline")
            unet2 = b.wall(b.tiler("-i", sample, "-m", b.unet2, "-o", out, "--no_progress"))
            b.emit("pipeline: 2-level UNet, tiler 1 rank, default flags", "seconds", unet2)
            stages = (b.report(out / "report.json").get("per_rank") or [{}])[0].get("stages") or {}
            b.emit("pipeline: 2-level UNet, stage sum / the rank's wall", "time_ratio",
                   ratio(stages.get("critical_path_sum"), stages.get("wall")))
            py = b.python_forward("-m", b.unet2, "--windows", n, "--threads", 2).get("seconds")
            b.emit(f"pipeline: 2-level UNet, pure forward in Python, 2 threads ({n} windows)", "seconds", py)
            b.emit("pipeline: 2-level UNet, tiler default flags / Python pure forward", "overhead_ratio",
                   ratio(unet2, py))


def stage_table(b, report, wall):
    """Rank 0's stage seconds (the report's per_rank[0].stages): the main thread's parts, each with its share of
    the rank's wall, their sum against that wall, then the busy seconds of the threads that overlap them; and
    the process's own wall (`wall`, measured outside) against the report's."""
    stages = (report.get("per_rank") or [{}])[0].get("stages")
    if not stages:
        return
    rank_wall = stages["wall"] or 0.0
    print("stage (main thread: the critical path)   seconds   share of wall", file=sys.stderr)
    path = stages["critical_path"]
    for name in ("libtorch", "model_load", "probe", "setup", "wait_read", "wait_forward", "gather", "submit",
                 "other", "drain"):
        seconds = path.get(name, 0.0)
        print(f"  {name:<38} {seconds:8.3f}   {seconds / rank_wall if rank_wall else 0:6.1%}", file=sys.stderr)
        b.emit(f"pipeline: stage {name}, default flags", "seconds", seconds)
    total = stages["critical_path_sum"]
    print(f"  {'sum':<38} {total:8.3f}   {total / rank_wall if rank_wall else 0:6.1%} of the rank's wall "
          f"{rank_wall:.3f} s (the process's {wall:.3f} s)", file=sys.stderr)
    print("overlapped (other threads' busy seconds)", file=sys.stderr)
    for name, seconds in stages["overlapped"].items():
        print(f"  {name:<38} {seconds:8.3f}", file=sys.stderr)
        b.emit(f"pipeline: busy {name}, default flags", "seconds", seconds)
    b.emit("pipeline: stage sum / the rank's wall", "time_ratio", ratio(total, rank_wall))


def bench_blas(b):
    reference = Path("/usr/lib") / (sysconfig.get_config_var("MULTIARCH") or "") / "blas"
    if not (reference / "libblas.so.3").is_file():
        print(f"bench blas: no reference BLAS at {reference} (Debian's libblas3): skipped", file=sys.stderr)
        return
    for _ in b.repeat():
        fwd, e2e = {}, {}
        for cfg in ("installed", "reference"):
            env = {"LD_LIBRARY_PATH": str(reference) if cfg == "reference" else ""}
            fwd[cfg] = b.json_out(b.tiler_bench("forward", "-m", b.model, "--windows", b.pipeline_windows,
                                                "--replicas", 2, "--threads", 1), "seconds", env).get("seconds")
            b.emit(f"blas: pure forward 2 x 1, {cfg} BLAS", "seconds", fwd[cfg])
            out = b.fresh("out_blas")
            e2e[cfg] = b.wall(b.tiler("-i", b.sample, "-m", b.model, "-o", out, "--no_progress"), env)
            b.emit(f"blas: tiler default flags, {cfg} BLAS", "seconds", e2e[cfg])
        b.emit("blas: pure forward, reference / installed", "time_ratio", ratio(fwd["reference"], fwd["installed"]))
        b.emit("blas: tiler default flags, reference / installed", "time_ratio",
               ratio(e2e["reference"], e2e["installed"]))


def bench_scaling(b):
    for _ in b.repeat():
        wps = {}
        for n, t in ((1, 2), (2, 1), (3, 1), (4, 1)):
            out = b.fresh("out_scaling")
            b.wall(b.ctrun(n, b.tool("tiler"), "-i", b.sample, "-m", b.model, "-o", out, "--threads", t,
                           "--no_progress"))
            wps[n, t] = field(b.report(out / "report.json"), "windows_per_second")
            b.emit(f"scaling: {n} rank(s) x {t} thread(s)", "windows_per_second", wps[n, t])
        b.emit("scaling: (2 x 1) / (1 x 2)", "throughput_ratio", ratio(wps[2, 1], wps[1, 2]))


def bench_ceiling(b):
    img = b.image(b.size(8192, 2048))
    configs = {  # name: (ranks, tiler flags, label)
        "1:default": (1, [], "1 rank(s) x default thread(s)"),
        "1:read1": (1, ["--read_threads", 1], "1 rank(s) x read1 thread(s)"),
        "1:2": (1, ["--threads", 2], "1 rank(s) x 2 thread(s)"),
        "1:1": (1, ["--threads", 1], "1 rank(s) x 1 thread(s)"),
        "2:1": (2, ["--threads", 1], "2 rank(s) x 1 thread(s)"),
        "2:sockets": (2, ["--threads", 1, "--no_shared_memory"], "2 rank(s) x 1 thread(s), gather through sockets"),
    }
    for _ in b.repeat():
        wall, cpu, read_sum = {}, {}, {}
        for cfg, (n, flags, label) in configs.items():
            out = b.fresh("out_ceiling")
            wall[cfg], cpu[cfg] = b.timed(b.ctrun(n, b.tool("tiler"), "-i", img, "-m", b.tiny, "-o", out, *flags,
                                                  "--no_progress"))
            r = b.report(out / "report.json")
            read_sum[cfg] = total(r, "read_seconds")
            name = f"ceiling: null model, {label}"
            b.emit(name, "seconds", wall[cfg])
            b.emit(name, "cpu_seconds", cpu[cfg])
            b.emit(name, "windows_per_second", ratio(field(r, "windows"), wall[cfg]))
            # The same from tiler's main() on: without loading the libraries.
            b.emit(name, "windows_per_second_after_start", field(r, "windows_per_second"))
            b.emit(name, "summed_read_seconds", read_sum[cfg])
            b.emit(name, "summed_tiles_decoded", total(r, "tiles_decoded"))
            b.emit(name, "forward_seconds", largest(r, "forward_seconds"))
            b.emit(name, "gather_seconds", largest(r, "gather_seconds"))
        b.emit("ceiling: process start and exit (tiler --version)", "seconds", b.wall(b.tiler("--version")))
        b.emit("ceiling: wall 1 rank default / the same with --read_threads 1", "ratio",
               ratio(wall["1:default"], wall["1:read1"]))
        b.emit("ceiling: wall 2 x 1 / 1 rank default", "ratio", ratio(wall["2:1"], wall["1:default"]))
        # What bounds that ratio on a machine with as many cores as ranks: 2 ranks can finish in 1 rank's wall
        # only if all they compute fits in it, cores x 1 rank's wall CPU seconds.
        b.emit("ceiling: CPU seconds 2 x 1 / 1 rank default", "ratio", ratio(cpu["2:1"], cpu["1:default"]))
        b.emit("ceiling: CPU seconds 2 x 1 / (cores x wall of 1 rank default)", "ratio",
               ratio(cpu["2:1"], b.cores * wall["1:default"]))
        b.emit("ceiling: wall 2 x 1 / 1 x 2", "ratio", ratio(wall["2:1"], wall["1:2"]))
        b.emit("ceiling: wall 2 x 1, gather through shared memory / through gloo's sockets", "ratio",
               ratio(wall["2:1"], wall["2:sockets"]))
        b.emit("ceiling: summed read seconds 2 x 1 / 1 x 2", "ratio", ratio(read_sum["2:1"], read_sum["1:2"]))
        b.emit("ceiling: summed read seconds 2 x 1 / 1 rank default", "ratio",
               ratio(read_sum["2:1"], read_sum["1:default"]))


def bench_gather(b):
    for _ in b.repeat():
        for n in (2, 4):
            per = {}
            for how in ("shared_memory", "sockets"):
                flags = ["--no_shared_memory"] if how == "sockets" else []
                out = b.json_out(b.ctrun(n, b.tool("tiler_bench"), "gather", "--mib", 4, "--gathers", 100, *flags),
                                 "ms_per_gather")
                per[how] = out.get("ms_per_gather")
                b.emit(f"gather: {n} ranks, 4 MiB a rank, through {how}", "ms_per_gather", per[how])
            b.emit(f"gather: {n} ranks, shared memory / sockets", "ratio", ratio(per["shared_memory"], per["sockets"]))


def bench_memory(b):
    for n in (2048,) if b.quick else (4096, 8192, 16384, 32768):
        img = b.image(n)
        for _ in b.repeat():
            out = b.fresh("out_memory")
            flags = ["-i", img, "-m", b.tiny, "-o", out, "--threads", 1, "--batch_size", 16, "--no_progress"]
            b.wall(b.ctrun(2, b.tool("tiler"), *flags))
            r = b.report(out / "report.json")
            b.emit(f"memory: {n}px RGB, 2 ranks", "rank0_peak_rss_mb", field(r, "peak_rss_mb", 1))
            b.emit(f"memory: {n}px RGB, 2 ranks", "rank1_peak_rss_mb", field(r, "peak_rss_mb", 2))
            b.emit(f"memory: {n}px RGB, 2 ranks", "seconds", field(r, "seconds"))
            b.fresh("out_memory")
            anon, file = b.peak_rss_split(b.tiler(*flags))
            b.emit(f"memory: {n}px RGB, 1 rank", "peak_rss_mb", field(b.report(out / "report.json"), "peak_rss_mb"))
            b.emit(f"memory: {n}px RGB, 1 rank", "peak_anon_mb", anon)
            b.emit(f"memory: {n}px RGB, 1 rank", "peak_file_mb", file)


def bench_naive(b):
    for n in (2048,) if b.quick else (4096, 8192):
        img = b.image(n)
        for _ in b.repeat():
            out = b.json_out(b.tiler_bench("naive", img, "-m", b.tiny, "--threads", 2, "--batch_size", 16),
                             "peak_rss_mb")
            b.emit(f"naive (whole image, full accumulators): {n}px", "peak_rss_mb", out.get("peak_rss_mb"))
            b.emit(f"naive (whole image, full accumulators): {n}px", "seconds", out.get("seconds"))
            d = b.fresh("out_naive")
            b.wall(b.tiler("-i", img, "-m", b.tiny, "-o", d, "--threads", 2, "--batch_size", 16, "--no_progress"))
            r = b.report(d / "report.json")
            b.emit(f"tiler (same job, 1 rank): {n}px", "peak_rss_mb", field(r, "peak_rss_mb"))
            b.emit(f"tiler (same job, 1 rank): {n}px", "seconds", field(r, "seconds"))


def bench_io(b):
    n = b.size(16384, 2048)
    img = b.image(n)
    for _ in b.repeat():
        out = b.json_out(b.tiler_bench("io", img, "--window", 256, "--overlap", 0.25), "mb_per_second")
        for metric in ("mb_per_second", "peak_rss_mb", "reader_rss_mb", "reader_rss_share_of_image"):
            b.emit(f"io: {n}px RGB tiled deflate, 256 px windows", metric, out.get(metric))


def bench_slide(b):
    n = b.size(8192, 2048)
    plain, svs = b.cache / f"slide_{n}.tif", b.cache / f"slide_{n}.svs"
    if not svs.exists():
        b.output(["vips", "tiffsave", b.image(n), plain, "--compression", "jpeg", "--Q", "90", "--tile",
                  "--tile-width", "256", "--tile-height", "256", "--pyramid"])
        shutil.copyfile(plain, svs)
        b.output(["tiffset", "-d", "0", "-s", "270", f"Aperio Image Library v12.0.5\n{n}x{n} [0,0 {n}x{n}] "
                  "(256x256) JPEG/RGB Q=90|AppMag = 40|MPP = 0.25", svs])
    for _ in b.repeat():
        for file in (svs, plain):
            for threads in (1, 2):
                out = b.json_out(b.tiler_bench("io", file, "--window", 256, "--overlap", 0.25, "--threads", threads),
                                 "mb_per_second")
                name = f"slide: {n}px JPEG, {out.get('reader', '')} reader, {threads} thread(s)"
                b.emit(name, "mb_per_second", out.get("mb_per_second"))
                b.emit(name, "windows_per_second", out.get("windows_per_second"))


def bench_tta(b):
    img = b.image(1024)
    for _ in b.repeat():
        for tta in ("none", "flip", "d4"):
            out = b.fresh("out_tta")
            b.wall(b.tiler("-i", img, "-m", b.model, "-o", out, "--threads", 2, "--no_progress", "--tta", tta))
            r = b.report(out / "report.json")
            b.emit(f"tta: {tta}, 1024 px, sample UNet, 2 threads", "forward_seconds", field(r, "forward_seconds"))
            b.emit(f"tta: {tta}, 1024 px, sample UNet, 2 threads", "seconds", field(r, "seconds"))


def bench_ctrun(b):
    for _ in range(b.runs * 5):
        b.emit("ctrun: --nproc_per_node 4 true", "seconds", b.wall(b.ctrun(4, "true")))


def bench_finetune(b):
    for _ in b.repeat():
        for n in (1, 2):
            d = b.fresh("ft")
            b.wall(b.ctrun(n, b.tool("tiler"), "finetune", "--images", "samples/train/images", "--labels",
                           "samples/train/labels", "-m", "samples/models/init.pt", "-o", d / "out.pt", "--epochs", 2,
                           "--window", 128, "--batch_size", 4, "--threads", 2 // n, "--no_progress"))
            r = b.report(d / "out.pt.report.json")
            step = field(r, "step_seconds")
            b.emit(f"finetune: {n} rank(s), batch 4/rank", "step_seconds", ratio(step, field(r, "steps")))
            b.emit(f"finetune: {n} rank(s), batch 4/rank", "sync_share", ratio(field(r, "sync_seconds"), step))
    # PyTorch's own loop (scripts/python_finetune.py: windows in memory, the same model, batch, Adam and threads)
    # against tiler's steps, reading and the all-reduce included, both over every step from the first
    # (--warmup 0: tiler's step_seconds count the first, profiling runs too).
    if not b.debian_python_has("torch"):
        return
    for _ in b.repeat():
        d = b.fresh("ft1")
        b.wall(b.tiler("finetune", "--images", "samples/train/images", "--labels", "samples/train/labels", "-m",
                       "samples/models/init.pt", "-o", d / "out.pt", "--epochs", 5, "--window", 128, "--overlap", 0,
                       "--batch_size", 4, "--threads", 1, "--val_fraction", 0, "--no_progress"))
        r = b.report(d / "out.pt.report.json")
        steps = field(r, "steps")
        out = b.json_out([DEBIAN_PYTHON, "scripts/python_finetune.py", "-m", "samples/models/init.pt", "--steps",
                          steps, "--window", 128, "--batch_size", 4, "--threads", 1, "--warmup", 0],
                         "steps_per_second")
        name = "finetune vs PyTorch's loop: 1 rank, batch 4, 1 thread"
        b.emit(name, "steps_per_second", ratio(steps, field(r, "step_seconds")))
        b.emit(name, "pytorch_steps_per_second", out.get("steps_per_second"))


def bench_mask(b):
    n = b.size(4096, 2048)
    slide = b.made(b.cache / f"slide_{n}_20.tif", "make", "--size", n, "--tissue", 0.2)
    for _ in b.repeat():
        wall = {}
        for mask in ("none", "auto"):
            out = b.fresh("out_mask")
            wall[mask] = b.wall(b.tiler("-i", slide, "-m", b.model, "-o", out, "--threads", 2, "--mask", mask,
                                        "--no_progress"))
            b.emit(f"mask: {n}px slide, 20% tissue, --mask {mask}", "seconds", wall[mask])
        b.emit(f"mask: {n}px slide, 20% tissue", "windows_processed",
               field(b.report(out / "report.json"), "windows_processed"))
        b.emit(f"mask: {n}px slide, masked / unmasked", "time_ratio", ratio(wall["auto"], wall["none"]))
        b.emit(f"mask: making the auto mask of a {n}px slide (tiler info)", "seconds",
               b.wall(b.tiler("info", slide, "--mask", "auto")))


def bench_outputs(b):
    n = b.size(8192, 2048)
    img = b.image(n)
    threshold = b.made(b.cache / "threshold.pt", "tiny-model", "--threshold")
    saves = {"plain": ["--save", "labels,probs"], "pyramid": ["--save", "labels,probs", "--pyramid"],
             "polygons": ["--save", "labels,probs,polygons"],
             "zarr": ["--save", "zarr"]}  # the same labels and probabilities, as one OME-Zarr store
    for _ in b.repeat():
        secs, rss = {}, {}
        for cfg, save in saves.items():
            out = b.fresh("out_outputs")
            b.wall(b.tiler("-i", img, "-m", threshold, "-o", out, "--threads", 2, "--batch_size", 16, *save,
                           "--no_progress"))
            r = b.report(out / "report.json")
            secs[cfg], rss[cfg] = field(r, "seconds"), field(r, "peak_rss_mb")
            name = f"outputs: {n}px, labels+probs, {cfg}"
            b.emit(name, "seconds", secs[cfg])
            b.emit(name, "peak_rss_mb", rss[cfg])
            b.emit(name, "windows_per_second", field(r, "windows_per_second"))
            b.emit(name, "bytes_written", apparent_bytes(out))
        for cfg in ("pyramid", "polygons", "zarr"):
            b.emit(f"outputs: {n}px, {cfg} / plain", "time_ratio", ratio(secs[cfg], secs["plain"]))
            b.emit(f"outputs: {n}px, {cfg} / plain", "rss_ratio", ratio(rss[cfg], rss["plain"]))
    # The output stage's capacity: the null model, 1 rank, windows/s by what is saved, how probabilities are
    # stored and how many threads compress; then 8 images on 1 and 2 ranks, and the largest rank's share of bytes.
    capacity = {"labels": ["--save", "labels"], "probs": ["--save", "labels,probs"],
                "probs:f16": ["--save", "labels,probs", "--probs_dtype", "f16"],
                "probs:u8": ["--save", "labels,probs", "--probs_dtype", "u8"],
                "probs:none": ["--save", "labels,probs", "--compression", "none"],
                "probs:w1": ["--save", "labels,probs", "--write_threads", 1]}
    m = b.size(4096, 1024)
    many = b.cache / f"many_{m}"
    many.mkdir(exist_ok=True)
    for k in range(1, 9):
        link = many / f"img{k}.tif"
        if not link.exists():
            link.symlink_to(b.image(m))
    for _ in b.repeat():
        wps = {}
        for cfg, save in capacity.items():
            out = b.fresh("out_capacity")
            b.wall(b.tiler("-i", img, "-m", b.tiny, "-o", out, *save, "--no_progress"))
            r = b.report(out / "report.json")
            wps[cfg] = field(r, "windows_per_second")
            b.emit(f"outputs: {n}px null model, {cfg}", "windows_per_second", wps[cfg])
            b.emit(f"outputs: {n}px null model, {cfg}", "peak_rss_mb", field(r, "peak_rss_mb"))
        for cfg in ("probs", "probs:f16", "probs:u8"):
            b.emit(f"outputs: {n}px null model, {cfg} / labels", "rate_ratio", ratio(wps[cfg], wps["labels"]))
        for nproc in (1, 2):
            out = b.fresh("out_many")
            b.wall(b.ctrun(nproc, b.tool("tiler"), "-i", many, "-m", b.tiny, "-o", out, "--save", "labels,probs",
                           "--no_progress"))
            r = b.report(out / "report.json")
            name = f"outputs: 8 x {m}px null model, {nproc} rank(s)"
            b.emit(name, "windows_per_second", field(r, "windows_per_second"))
            b.emit(name, "largest_byte_share", ratio(largest(r, "bytes_written"), total(r, "bytes_written")))


def bench_zarr(b):
    n = b.size(8192, 2048)
    img = b.image(n)
    configs = {"tiff": ["--save", "labels,probs"], "zarr": ["--save", "zarr"],
               "tiff:u8": ["--save", "labels,probs", "--probs_dtype", "u8"],
               "zarr:u8": ["--save", "zarr", "--probs_dtype", "u8"]}
    for _ in b.repeat():
        wps = {}
        for cfg, flags in configs.items():
            out = b.fresh("out_zarr")
            b.wall(b.tiler("-i", img, "-m", b.tiny, "-o", out, *flags, "--no_progress"))
            wps[cfg] = field(b.report(out / "report.json"), "windows_per_second")
            b.emit(f"zarr: {n}px null model, {cfg}", "windows_per_second", wps[cfg])
            b.emit(f"zarr: {n}px null model, {cfg}", "bytes_written", apparent_bytes(out))
            b.emit(f"zarr: {n}px null model, {cfg}", "files_written", files_written(out))
        b.emit(f"zarr: {n}px null model, zarr / tiff", "rate_ratio", ratio(wps["zarr"], wps["tiff"]))
        b.emit(f"zarr: {n}px null model, zarr:u8 / tiff:u8", "rate_ratio", ratio(wps["zarr:u8"], wps["tiff:u8"]))
    # Peak RSS on a larger image: the writers stream band by band, the store may not hold more.
    m = b.size(16384, 4096)
    big = b.image(m)
    rss = {}
    for cfg in ("tiff", "zarr"):
        out = b.fresh("out_zarr")
        b.wall(b.tiler("-i", big, "-m", b.tiny, "-o", out, *configs[cfg], "--no_progress"))
        rss[cfg] = field(b.report(out / "report.json"), "peak_rss_mb")
        b.emit(f"zarr: {m}px null model, {cfg}", "peak_rss_mb", rss[cfg])
    b.emit(f"zarr: {m}px null model, zarr / tiff", "rss_ratio", ratio(rss["zarr"], rss["tiff"]))


def bench_objects(b):
    n = b.size(8192, 2048)
    instances = ROOT / "samples/models/instances.pt"

    def discs(pitch):
        return b.made(b.cache / f"discs_{n}_{pitch}.tif", "make", "--size", n, "--discs", pitch)

    def run(img, nproc, *flags):  # -> (seconds, peak RSS MB of the largest rank, objects)
        out = b.fresh("out_objects")
        b.wall(b.ctrun(nproc, b.tool("tiler"), "-i", img, "-m", instances, "-o", out, "--batch_size", 16,
                       "--no_progress", *flags))
        r = b.report(out / "report.json")
        return field(r, "seconds"), largest(r, "peak_rss_mb"), field(r, "objects")

    segment = ("--task", "segment", "--save", "labels")
    objects = ("--task", "instances", "--save", "objects,objects_csv,instances")
    for _ in b.repeat():
        img = discs(36)
        seg_s, _, _ = run(img, 1, *segment)
        ins_s, ins_rss, count = run(img, 1, *objects)
        name = f"objects: {n}px, {count} discs"
        b.emit(f"{name}, segment labels", "seconds", seg_s)
        b.emit(f"{name}, instances objects+csv+tiff", "seconds", ins_s)
        b.emit(f"{name}, instances / segment labels", "time_ratio", ratio(ins_s, seg_s))
        b.emit(f"{name}, instances", "peak_rss_mb", ins_rss)
        b.emit(f"{name}, instances, 2 ranks / 1", "time_ratio", ratio(run(img, 2, *objects)[0], ins_s))
        b.emit(f"{name}, segment labels, 2 ranks / 1", "time_ratio", ratio(run(img, 2, *segment)[0], seg_s))
        _, few_rss, few = run(discs(82), 1, *objects)
        _, many_rss, lots = run(discs(26), 1, *objects)
        b.emit(f"objects: {n}px, {lots} vs {few} discs, instances", "rss_ratio", ratio(many_rss, few_rss))


def viewport_query(store, side, repeats=20):
    """Seconds (median) of SQLiteStore's bbox_intersects query of a `side` px square at the store's centre, with
    its columns (key, properties, cx, cy, geometry) fetched and each geometry decompressed and loaded (shapely
    where installed, as SQLiteStore.query does), and the number of objects it found."""
    import sqlite3
    import statistics
    import zlib
    try:
        from shapely import wkb as shapely_wkb
        load = shapely_wkb.loads
    except ImportError:
        load = bytes
    sql = ("SELECT [key], properties, cx, cy, geometry\n                 FROM annotations, rtree\n"
           "                WHERE annotations.id == rtree.id\n                AND max_x >= :min_x AND min_x <= :max_x "
           "AND max_y >= :min_y AND min_y <= :max_y ")
    con = sqlite3.connect(f"file:{store}?mode=ro", uri=True)
    x0, x1, y0, y1 = con.execute("SELECT min(min_x), max(max_x), min(min_y), max(max_y) FROM rtree").fetchone()
    cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
    box = {"min_x": cx - side / 2, "max_x": cx + side / 2, "min_y": cy - side / 2, "max_y": cy + side / 2}
    times, found = [], 0
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        rows = con.execute(sql, box).fetchall()
        for _key, properties, _cx, _cy, geometry in rows:
            json.loads(properties)
            load(zlib.decompress(geometry))
        times.append(time.perf_counter() - t0)
        found = len(rows)
    con.close()
    return statistics.median(times[1:]), found


def tiatoolbox_viewport_query(store, side, source, repeats=20):
    """As viewport_query, through TIAToolbox's own SQLiteStore.query(box, geometry_predicate="bbox_intersects")
    (its source tree imported as tests/objects_store_check.py does; over a copy, as SQLiteStore writes)."""
    import importlib.util
    import statistics
    spec = importlib.util.spec_from_file_location("objects_store_check", ROOT / "tests/objects_store_check.py")
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    with tempfile.TemporaryDirectory() as stub:
        SQLiteStore = check.import_sqlitestore(source, stub)
        from shapely.geometry import box
        copy = Path(stub) / "store.db"
        shutil.copy(store, copy)
        s = SQLiteStore(str(copy))
        x0, y0, x1, y1 = s.con.execute("SELECT min(min_x), min(min_y), max(max_x), max(max_y) FROM rtree").fetchone()
        cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
        viewport = box(cx - side / 2, cy - side / 2, cx + side / 2, cy + side / 2)
        times, found = [], 0
        for _ in range(repeats + 1):
            t0 = time.perf_counter()
            found = len(s.query(viewport, geometry_predicate="bbox_intersects"))
            times.append(time.perf_counter() - t0)
        s.close()
        del s
    return statistics.median(times[1:]), found


def tiatoolbox_own_store_bytes(store, source):
    """The bytes of TIAToolbox's own store of the same annotations (SQLiteStore.append_many of what it reads
    from `store`: its uuid keys, its defaults)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("objects_store_check", ROOT / "tests/objects_store_check.py")
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    with tempfile.TemporaryDirectory() as stub:
        SQLiteStore = check.import_sqlitestore(source, stub)
        copy = Path(stub) / "ours.db"
        shutil.copy(store, copy)
        ours, own = SQLiteStore(str(copy)), SQLiteStore(str(Path(stub) / "own.db"))
        own.append_many(ours.values())
        own.close()
        ours.close()
        del own, ours
        return (Path(stub) / "own.db").stat().st_size


def bench_objects_store(b):
    n = b.size(32768, 8192)
    instances = ROOT / "samples/models/instances.pt"

    def discs(pitch):
        return b.made(b.cache / f"discs_{n}_{pitch}.tif", "make", "--size", n, "--discs", pitch)

    def run(img, save, name):  # -> (output directory, report): one rank, default flags
        out = b.fresh(name)
        b.wall(b.tiler("-i", img, "-m", instances, "-o", out, "--no_progress", "--task", "instances", "--save",
                       save))
        return out, b.report(out / "report.json")

    # About a million discs and about 100 000 (a pitch of n / 1024 and n / 316 px).
    many, few = discs(n // 1024), discs(round(n / 316))
    for _ in b.repeat():
        out, r = run(many, "objects,objects_store", "out_store_many")
        _, plain = run(many, "objects", "out_store_plain")
        out_few, r_few = run(few, "objects,objects_store", "out_store_few")
        count, few_count = field(r, "objects"), field(r_few, "objects")
        name = f"objects_store: {n}px, {count} discs"
        stem = many.stem
        store, geojson = out / f"{stem}_objects.db", out / f"{stem}_objects.geojson"
        b.emit(f"{name}, objects + objects_store", "seconds", field(r, "seconds"))
        b.emit(f"{name}, objects alone", "seconds", field(plain, "seconds"))
        b.emit(f"{name}, the store's write", "seconds", plus(field(r, "seconds"), -field(plain, "seconds")))
        b.emit(f"{name}, objects + objects_store", "peak_rss_mb", field(r, "peak_rss_mb"))
        b.emit(f"objects_store: {n}px, {count} vs {few_count} discs", "rss_ratio",
               ratio(field(r, "peak_rss_mb"), field(r_few, "peak_rss_mb")))
        b.emit(f"{name}, store", "bytes_written", store.stat().st_size)
        b.emit(f"{name}, geojson", "bytes_written", geojson.stat().st_size)
        b.emit(f"{name}, store / geojson", "size_ratio", ratio(store.stat().st_size, geojson.stat().st_size))
        # A 2000 px viewport of the full image (32768 px: about 3 900 objects, a square millimetre of nuclei at
        # 0.5 um/px), scaled with the image so that it holds as many objects.
        side = 2000 * n // 32768
        seconds, found = viewport_query(store, side)
        b.emit(f"{name}, {side} px viewport ({found} objects), sqlite3", "query_seconds", round(seconds, 5))
        if os.environ.get("TILER_TIATOOLBOX_SOURCE"):
            seconds, found = tiatoolbox_viewport_query(store, side, os.environ["TILER_TIATOOLBOX_SOURCE"])
            b.emit(f"{name}, {side} px viewport ({found} objects), SQLiteStore", "query_seconds", round(seconds, 5))
            # TIAToolbox's own store of the same objects, written by SQLiteStore itself (the smaller image's:
            # Python writes it at some thousands of objects a second).
            few_store = out_few / f"{few.stem}_objects.db"
            b.emit(f"objects_store: {n}px, {few_count} discs, store / TIAToolbox's own store", "size_ratio",
                   ratio(few_store.stat().st_size, tiatoolbox_own_store_bytes(few_store,
                                                                              os.environ["TILER_TIATOOLBOX_SOURCE"])))


def bench_heads(b):
    heads = ROOT / "samples/models/heads.pt"

    def run(*flags):  # -> (wall, CPU seconds) of the whole process
        out = b.fresh("out_heads")
        return b.timed(b.tiler("-i", b.sample, "-m", heads, "-o", out, "--no_progress", *flags))

    three = ["--heads", "np:segment,hv:regress,tp:segment", "--head_opt", "np.activation=softmax", "--head_opt",
             "tp.activation=softmax", "--head_opt", "tp.classes=bg,a,b", "--head_opt", "hv.save=probs",
             "--head_opt", "hv.probs_dtype=f16"]
    for _ in b.repeat():
        one_w, one_c = run("--output_key", "np", "--activation", "softmax", "--save", "labels,probs")
        three_w, three_c = run(*three, "--save", "labels,probs")
        hv_w, _ = run("--output_key", "hv", "--save", "probs", "--probs_dtype", "f16")
        tp_w, _ = run("--output_key", "tp", "--activation", "softmax", "--classes", "bg,a,b", "--save", "labels,probs")
        onel_w, onel_c = run("--output_key", "np", "--activation", "softmax", "--save", "labels")
        threel_w, threel_c = run("--heads", "np,hv,tp", "--activation", "softmax", "--save", "labels")
        b.emit("heads: np alone, labels+probs (process)", "seconds", one_w)
        b.emit("heads: np,hv,tp in one job, labels+probs (process)", "seconds", three_w)
        b.emit("heads: three heads / np alone, labels+probs", "time_ratio", ratio(three_w, one_w))
        b.emit("heads: three heads / np alone, labels+probs", "cpu_ratio", ratio(three_c, one_c))
        b.emit("heads: three heads / the three single-head jobs", "time_ratio",
               ratio(three_w, plus(one_w, hv_w, tp_w)))
        b.emit("heads: three heads / np alone, labels only", "time_ratio", ratio(threel_w, onel_w))
        b.emit("heads: three heads / np alone, labels only", "cpu_ratio", ratio(threel_c, onel_c))


def bench_codecs(b):
    n = b.size(4096, 1024)
    img = b.image(n)
    noise = b.made(b.cache / f"noise_{n}.tif", "make", "--size", n, "--noise")
    tiny5 = b.made(b.cache / "tiny5.pt", "tiny-model", "--classes", 5)
    codecs = os.environ.get("CODECS") or "deflate:1,deflate:3,deflate:6,deflate:9,zstd:1,zstd:3,zstd:9,lzw,none"
    specs = [("random 2 classes", b.tiny, noise), ("textured 2 classes", b.tiny, img),
             ("textured 5 classes", tiny5, img),
             ("smooth (UNet)", b.model, ROOT / "samples/images/blobs_4096.tif")]
    for name, net, source in specs:
        spec = f"{name}:{net}:{source}"
        for dtype in ("f32", "f16", "u8"):
            out = b.cache / f"out_codecs_{dtype}"
            done = out / "done"
            if not done.exists() or done.read_text().strip() != spec:
                b.fresh(out.name)
                b.wall(b.tiler("-i", source, "-m", net, "-o", out, "--save", "labels,probs", "--probs_dtype", dtype,
                               "--compression", "none", "--no_progress"))
                done.write_text(spec + "\n")
            files = sorted(glob.glob(str(out / "*_probs.tif")))
            if dtype == "u8":
                files += sorted(glob.glob(str(out / "*_labels.tif")))
            for f in files:
                kind = "labels" if f.endswith("_labels.tif") else f"probs {dtype}"
                for _ in b.repeat():
                    text = b.output(b.tiler_bench("codecs", f, "--codecs", codecs, "--scratch",
                                                  b.cache / "codecs-scratch.tif"), merge=False)
                    for line in text.splitlines():
                        try:
                            row = json.loads(line)
                        except json.JSONDecodeError:
                            continue
                        if not isinstance(row, dict) or "codec" not in row:
                            continue
                        codec = row["codec"] + (", no predictor" if row.get("predictor") is False else "")
                        b.emit(f"codecs: {name}, {kind}, {codec}", "ratio", row.get("ratio"))
                        b.emit(f"codecs: {name}, {kind}, {codec}", "mb_per_s", row.get("mb_per_s"))


def bench_embed(b):
    n = b.size(8192, 2048)
    img = b.image(n)
    encoders = [("bundled", ROOT / "samples/models/encoder.pt", 256)]
    if b.debian_python_has("torchvision"):
        r18 = b.cache / "resnet18.pt"
        if not r18.exists():
            b.output([DEBIAN_PYTHON, "scripts/export_model.py", "--encoder", "torchvision:resnet18", "--out", r18,
                      "--window", 224])
        encoders.append(("resnet18", r18, 224))
    for name, encoder, window in encoders:
        for _ in b.repeat():
            out = b.fresh("out_embed")
            wall = b.wall(b.tiler("-i", img, "-m", encoder, "-o", out, "--window", window, "--no_progress"))
            r = b.report(out / "report.json")
            job, windows = field(r, "seconds"), field(r, "windows_total")
            pure = b.json_out(b.tiler_bench("forward", "-m", encoder, "--window", window, "--windows", windows,
                                            "--batch_size", 8, "--replicas", field(r, "replicas"), "--threads",
                                            field(r, "threads")), "seconds").get("seconds")
            b.emit(f"embed {name}: {n}px, {windows} windows, pure forward in tiler's layout", "seconds", pure)
            b.emit(f"embed {name}: tiler --task embed (job, report)", "seconds", job)
            b.emit(f"embed {name}: tiler --task embed (process, wall)", "seconds", wall)
            b.emit(f"embed {name}: tiler job / pure forward", "overhead_ratio", ratio(job, pure))
            b.emit(f"embed {name}: tiler process / pure forward", "overhead_ratio", ratio(wall, pure))
            b.emit(f"embed {name}: tiler --task embed", "windows_per_second", field(r, "windows_per_second"))
            if b.debian_python_has("torch"):
                py = b.python_forward("-m", encoder, "--window", window, "--windows", windows, "--threads", 2)
                b.emit(f"embed {name}: pure forward in Python, 2 threads", "seconds", py.get("seconds"))
                b.emit(f"embed {name}: tiler process / Python forward", "overhead_ratio",
                       ratio(wall, py.get("seconds")))


def bench_runtimes(b):
    if "pt2" not in b.output(b.tiler("--version")):
        raise BenchError("this tiler runs no .pt2 packages (LibTorch 2.6+ is needed)")
    device = os.environ.get("RUNTIMES_DEVICE", "cpu")
    source, flags = ROOT / "samples/images/blobs_4096.tif", ["--device", device]
    if device == "cuda":
        source = b.cache / "runtimes_in"
        source.mkdir(exist_ok=True)
        b.made(source / "img1.tif", "make", "--size", 16384)
        if not (source / "img2.tif").exists():
            shutil.copyfile(source / "img1.tif", source / "img2.tif")
        flags += ["--precision", "fp32"]
    for name, cls, file, task in (("unet", "UNet", "sample.pt", []), ("encoder", "Encoder", "encoder.pt",
                                                                      ["--task", "embed"])):
        script = ROOT / "samples/models" / file
        package = b.cache / f"{file[:-3]}_256_{device}.pt2"
        if not package.exists():
            p = subprocess.run(["python3", "scripts/export_model.py", "--module", f"make_samples:{cls}", "--weights",
                                str(script), "--out", str(package), "--window", "256", "--device", device],
                               cwd=ROOT, env=b.env({"PYTHONPATH": "samples"}), stdout=subprocess.DEVNULL)
            # Exit 3: the package is made but Python's own loader crashed checking it (seen with PyTorch 2.11 on
            # CUDA): tiler's C++ loader runs it below all the same.
            if not (p.returncode == 0 or (p.returncode == 3 and package.exists())):
                raise BenchError(f"scripts/export_model.py exited {p.returncode} exporting {package.name}")
        for _ in b.repeat():
            wall = {}
            for runtime, m in (("torchscript", script), ("pt2", package)):
                out = b.fresh("out_runtime")
                wall[runtime] = b.wall(b.tiler("-i", source, "-m", m, "-o", out, *flags, *task, "--no_progress"))
                r = b.report(out / "report.json")
                b.emit(f"runtimes {name} ({device}): tiler whole process, {runtime}", "seconds", wall[runtime])
                if device == "cpu":
                    pure = b.json_out(b.tiler_bench("forward", "-m", m, "--window", 256, "--windows",
                                                    field(r, "windows_total"), "--batch_size", 8, "--replicas",
                                                    field(r, "replicas"), "--threads", field(r, "threads")), "seconds")
                    b.emit(f"runtimes {name} ({device}): pure forward in tiler's layout, {runtime}", "seconds",
                           pure.get("seconds"))
                else:
                    b.emit(f"runtimes {name} ({device}): tiler forward (report), {runtime}", "seconds",
                           total(r, "forward_seconds"))
            b.emit(f"runtimes {name} ({device}): pt2 / torchscript, whole process", "ratio",
                   ratio(wall["pt2"], wall["torchscript"]))


FCN_EXPORT = """
import sys, torch, torchvision
m = torchvision.models.segmentation.fcn_resnet50(weights=None, weights_backbone=None, num_classes=2,
                                                 aux_loss=False).eval()
class Out(torch.nn.Module):
    def __init__(self, m): super().__init__(); self.m = m
    def forward(self, x): return self.m(x)['out']
torch.jit.trace(Out(m), torch.rand(1, 3, 512, 512)).save(sys.argv[1])
"""


def bench_gpu(b):
    size = b.size(int(os.environ.get("GPU_BENCH_SIZE", 16384)), 4096)
    source = b.cache / f"gpu_in_{size}"
    source.mkdir(exist_ok=True)
    b.made(source / "img1.tif", "make", "--size", size)
    for k in range(2, int(os.environ.get("GPU_BENCH_IMAGES", 4)) + 1):
        if not (source / f"img{k}.tif").exists():
            shutil.copyfile(source / "img1.tif", source / f"img{k}.tif")
    fcn = b.cache / "fcn_resnet50.pt"
    if not fcn.exists():
        b.output(["python3", "-c", FCN_EXPORT, fcn])

    def case(name, m, window, batch, precision, save, *flags):
        out = b.fresh("out_gpu")
        wall = b.wall(b.tiler("-i", source, "-m", m, "-o", out, "--device", "cuda", "--precision", precision,
                              "--window", window, "--batch_size", batch, "--save", save, "--probs_dtype", "u8",
                              "--no_progress", *flags))
        r = b.report(out / "report.json")
        windows = total(r, "windows_total")
        py = b.json_out(["python3", "scripts/python_forward.py", "-m", m, "--device", "cuda", "--precision",
                         precision, "--window", window, "--batch_size", batch, "--windows", windows, "--threads",
                         b.cores], "seconds").get("seconds")
        b.emit(f"gpu {name}: tiler whole process", "seconds", wall)
        b.emit(f"gpu {name}: tiler forward (report)", "seconds", total(r, "forward_seconds"))
        b.emit(f"gpu {name}: tiler read (report)", "seconds", total(r, "read_seconds"))
        b.emit(f"gpu {name}: tiler write (report)", "seconds", total(r, "write_seconds"))
        b.emit(f"gpu {name}: tiler start-up (report)", "seconds", largest(r, "startup_seconds"))
        b.emit(f"gpu {name}: pure forward in Python ({windows} windows)", "seconds", py)
        b.emit(f"gpu {name}: whole process / pure forward", "overhead_ratio", ratio(wall, py))

    for _ in b.repeat():
        case("unet 256px b64 fp16 labels", b.model, 256, 64, "fp16", "labels")
        case("unet 256px b64 fp16 labels, blended on the host", b.model, 256, 64, "fp16", "labels", "--stitch", "host")
        case("unet 256px b64 fp16 labels+u8 probs", b.model, 256, 64, "fp16", "labels,probs")
        case("unet 256px b8 fp16 labels", b.model, 256, 8, "fp16", "labels")
        case("unet 256px b64 bf16 labels", b.model, 256, 64, "bf16", "labels")
        case("fcn_resnet50 512px b16 fp16 labels", fcn, 512, 16, "fp16", "labels")
        case("fcn_resnet50 512px b16 fp16 labels, blended on the host", fcn, 512, 16, "fp16", "labels", "--stitch",
             "host")
        case("fcn_resnet50 512px b16 fp16 labels+u8 probs", fcn, 512, 16, "fp16", "labels,probs")


@dataclass
class Row:
    name: str
    measures: str
    runs: str  # how: the commands, and what --quick shrinks
    reports: str  # the metrics it emits
    fn: Callable
    in_all: bool = True


def make_object_store(path, count, size):
    """A TIAToolbox-layout store of `count` 12-sided cells over a size x size slide (zlib WKB, R-tree)."""
    import random
    import sqlite3
    import struct
    import zlib
    tmp = Path(str(path) + ".partial")
    tmp.unlink(missing_ok=True)
    con = sqlite3.connect(tmp)
    con.execute("CREATE TABLE metadata (key TEXT UNIQUE, value TEXT)")
    con.executemany("INSERT INTO metadata VALUES (?, ?)", [("version", '"1.0.1"'), ("compression", '"zlib"'),
                                                            ("compression_level", "9")])
    con.execute("CREATE VIRTUAL TABLE rtree USING rtree(id, min_x, max_x, min_y, max_y)")
    con.execute("CREATE TABLE annotations(id INTEGER PRIMARY KEY, key TEXT UNIQUE, objtype TEXT, cx FLOAT NOT NULL, "
                "cy FLOAT NOT NULL, geometry BLOB, properties TEXT, area FLOAT NOT NULL)")
    rng = random.Random(7)
    angles = [2 * math.pi * k / 12 for k in range(13)]
    rows, boxes = [], []
    for i in range(1, count + 1):
        cx, cy, r = rng.uniform(8, size - 8), rng.uniform(8, size - 8), rng.uniform(3, 7)
        ring = [(cx + r * math.cos(a), cy + r * math.sin(a)) for a in angles]
        wkb = struct.pack("<BII", 1, 3, 1) + struct.pack("<I", len(ring)) + b"".join(struct.pack("<dd", *p) for p in ring)
        rows.append((i, f"k{i}", "Polygon", cx, cy, zlib.compress(wkb, 6), '{"type": "cell"}', math.pi * r * r))
        boxes.append((i, cx - r, cx + r, cy - r, cy + r))
        if len(rows) == 50000 or i == count:
            con.executemany("INSERT INTO annotations VALUES (?,?,?,?,?,?,?,?)", rows)
            con.executemany("INSERT INTO rtree VALUES (?,?,?,?,?)", boxes)
            rows, boxes = [], []
    con.commit()
    con.close()
    os.replace(tmp, path)


def bench_view(b):
    import http.client
    import random
    from view_server import start_view, stop_view
    n = b.size(16384, 2048)
    cells = b.size(1000000, 20000)
    slide = b.cache / f"view_slide_{n}.tif"
    if not slide.exists():
        b.output(["vips", "tiffsave", b.image(n), slide, "--compression", "jpeg", "--Q", "90", "--tile",
                  "--tile-width", "256", "--tile-height", "256", "--pyramid"])
    out = b.cache / f"view_out_{n}"
    if not (out / "report.json").exists():
        shutil.rmtree(out, ignore_errors=True)
        b.output(b.tiler("-i", slide, "-o", out, "-m", b.tiny, "--save", "labels,probs", "--pyramid", "--batch_size",
                         16, "--no_progress"))
    store = out / f"view_slide_{n}_objects.db"
    if not store.exists():
        make_object_store(store, cells, n)
    report = json.loads((out / "report.json").read_text())
    report["images"][0]["outputs"]["objects_store"] = str(store)
    (out / "report.json").write_text(json.dumps(report))
    rng = random.Random(3)
    # A viewer's session: at each power-of-two scale, up to 24 tiles of each raster, then viewports of objects.
    tiles = []
    scale = 1
    while n // scale >= 256:
        per_side = (n // scale + 255) // 256
        for _ in range(min(24, per_side * per_side)):
            tx, ty = rng.randrange(per_side), rng.randrange(per_side)
            x, y = tx * 256 * scale, ty * 256 * scale
            w, h = min(256 * scale, n - x), min(256 * scale, n - y)
            size = f"{max(1, w // scale)},{max(1, h // scale)}"
            for layer in ("input", "labels", "probs-0"):
                tiles.append(f"/iiif/0/{layer}/{x},{y},{w},{h}/{size}/0/default.png")
        scale *= 2
    views = []
    for side in (512, 2048, 8192, n):
        side = min(side, n)
        for _ in range(8):
            x, y = rng.randrange(n - side + 1), rng.randrange(n - side + 1)
            views.append(f"/api/objects?image=0&x={x}&y={y}&w={side}&h={side}")
    for _ in b.repeat():
        try:
            server, port, _ = start_view(b.tool("tiler"), out)
        except RuntimeError as e:
            raise BenchError(str(e))
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)

            def fetch(path):
                t0 = time.monotonic()
                conn.request("GET", path)
                r = conn.getresponse()
                r.read()
                if r.status != 200:
                    raise BenchError(f"tiler view: {path}: {r.status}")
                return (time.monotonic() - t0) * 1000

            def percentiles(name, ms):
                ms = sorted(ms)
                b.emit(name, "p50_ms", ms[len(ms) // 2])
                b.emit(name, "p95_ms", ms[min(len(ms) - 1, int(len(ms) * 0.95))])

            percentiles(f"view: {n}px tiles, cold", [fetch(t) for t in tiles])
            percentiles(f"view: {n}px tiles, warm", [fetch(t) for t in tiles])
            percentiles(f"view: {cells} objects by viewport, cold", [fetch(v) for v in views])
            percentiles(f"view: {cells} objects by viewport, warm", [fetch(v) for v in views])
            conn.close()
            status = Path(f"/proc/{server.pid}/status").read_text()
            hwm = next(int(l.split()[1]) for l in status.splitlines() if l.startswith("VmHWM:"))
            b.emit(f"view: {n}px, {cells} objects", "peak_rss_mb", hwm / 1024)
        finally:
            stop_view(server)


SMALL_CONV_NET = """import sys, torch
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(16, 16, 3, padding=1),
                          torch.nn.ReLU(), torch.nn.Conv2d(16, 2, 1)).eval()
torch.jit.script(net).save(sys.argv[1])
"""


def bench_python(b):
    module_dir = b.bin / "python"
    if not list(module_dir.glob("tiler*.so")) or not b.debian_python_has("torch"):
        print(f"bench python: no module in {module_dir} or no torch in {DEBIAN_PYTHON}: skipped", file=sys.stderr)
        return
    small = b.cache / "small_conv.pt"
    if not small.exists():
        b.output([DEBIAN_PYTHON, "-c", SMALL_CONV_NET, small])
    size = b.size(4096, 1024)
    for name, model in (("small conv net", small), ("sample UNet", b.model)):
        for _ in b.repeat():
            out = b.json_out([DEBIAN_PYTHON, "scripts/python_predict.py", "--module_dir", module_dir, "-m", model,
                              "--size", size, "--threads", 2], "seconds")
            scenario = f"python: {size}px, {name}, 2 threads"
            b.emit(f"{scenario}, tiler.predict", "seconds", out.get("seconds"))
            b.emit(f"{scenario}, MONAI's sliding window in PyTorch", "seconds", out.get("monai_seconds"))
            b.emit(f"{scenario}: MONAI's / tiler.predict", "speedup", out.get("speedup"))
            b.emit(f"{scenario}: tiler.predict against MONAI's", "max_abs_difference", out.get("max_abs_difference"))
    job = ["--threads", 2, "--no_progress"]
    for _ in b.repeat():
        out = b.fresh("out_python_command")
        command = b.wall(b.tiler("-i", b.sample, "-m", b.model, "-o", out, *job))
        out = b.fresh("out_python_infer")
        call = (f"import sys; sys.path.insert(0, {str(module_dir)!r}); import tiler; "
                f"tiler.infer({str(b.sample)!r}, {str(out)!r}, {b.model!r}, threads=2, no_progress=True)")
        infer = b.wall([DEBIAN_PYTHON, "-c", call])
        b.emit("python: tiler command, pipeline's job", "seconds", command)
        b.emit("python: tiler.infer in python3, the same job", "seconds", infer)
        b.emit("python: tiler.infer / command", "time_ratio", ratio(infer, command))


BENCHES = [
    Row("model", "the sample UNet's pure batched forward by batch and precision",
        "tiler_bench forward -m sample.pt --windows 64 --threads 2, batch 1/4/8/16 x fp32/bf16",
        "windows_per_second", bench_model),
    Row("light", "the null model's pure forward by threads and batch, C++ and Python on the same LibTorch "
        "(LibTorch 1.13 gives a 1x1 convolution to oneDNN on 2+ threads or batch 16+)",
        "tiler_bench forward -m tiny.pt --windows 160 and python_forward.py, 1x8 / 2x8 / 1x16 (threads x batch)",
        "windows_per_second", bench_light),
    Row("pipeline", "the whole tiler process against the pure forward of as many windows: C++ in 1x2 and in "
        "tiler's default layout, Python (as loaded and frozen); default flags (optimised) against "
        "--no_jit_optimize; the default run's stage table (the report's per_rank[0].stages) on stderr; the "
        "default run and Python's forward again with a 2-level UNet (scripts/make_unet.py)",
        "tiler -i blobs_4096.tif (441 windows; --quick: 1024 px, 25) -m sample.pt|unet2.pt, --threads 2 / "
        "default / --no_jit_optimize; tiler_bench forward; python_forward.py --threads 2 [--optimize]",
        "seconds, replicas, threads_per_replica, overhead_ratio, time_ratio", bench_pipeline),
    Row("blas", "the installed BLAS (OpenBLAS) against Debian's reference libblas3, pure forward and whole process",
        "LD_LIBRARY_PATH=/usr/lib/<multiarch>/blas tiler_bench forward --replicas 2 --threads 1; tiler default "
        "flags (skipped without libblas3)", "seconds, time_ratio", bench_blas),
    Row("scaling", "ranks x threads over the pipeline's input, sample UNet",
        "ctrun --nproc_per_node 1/2/3/4 tiler --threads 2/1/1/1", "windows_per_second, throughput_ratio",
        bench_scaling),
    Row("ceiling", "the null model on an 8192 px tiled deflate TIFF (--quick: 2048), where reading, exchange and "
        "writing are all there is: 1 rank default / --read_threads 1 / 1x2 / 1x1, 2x1 through shared memory and "
        "sockets; process start-up",
        "ctrun --nproc_per_node N tiler -m tiny.pt [--threads T] [--no_shared_memory]; tiler --version",
        "seconds, cpu_seconds, windows_per_second(_after_start), summed_read_seconds, summed_tiles_decoded, "
        "forward_seconds, gather_seconds, ratio", bench_ceiling),
    Row("gather", "the step gather alone, ranks as processes, 4 MiB a rank: shared memory against gloo's sockets",
        "ctrun --nproc_per_node 2/4 tiler_bench gather --mib 4 --gathers 100 [--no_shared_memory]",
        "ms_per_gather, ratio", bench_gather),
    Row("memory", "peak RSS by image size, null model, batch 16: 2 ranks (each rank's) and 1 rank (anonymous and "
        "file pages sampled)", "ctrun --nproc_per_node 2 tiler / tiler --threads 1 --batch_size 16 over 4096, "
        "8192, 16384, 32768 px (--quick: 2048)",
        "rank0_peak_rss_mb, rank1_peak_rss_mb, seconds, peak_rss_mb, peak_anon_mb, peak_file_mb", bench_memory),
    Row("naive", "whole-image inference with full accumulators against tiler's bands, the same job",
        "tiler_bench naive IMG -m tiny.pt --threads 2 --batch_size 16; tiler the same, 4096 and 8192 px "
        "(--quick: 2048)", "peak_rss_mb, seconds", bench_naive),
    Row("io", "tiler's TIFF reader alone, 256 px windows, 25% overlap, 16384 px RGB tiled deflate (--quick: 2048)",
        "tiler_bench io IMG --window 256 --overlap 0.25",
        "mb_per_second, peak_rss_mb, reader_rss_mb, reader_rss_share_of_image", bench_io),
    Row("slide", "the same JPEG tiles (Q90, 256 px, pyramid) read as an Aperio slide through OpenSlide and as a "
        "plain TIFF through tiler's libtiff reader, 1 and 2 threads, 8192 px (--quick: 2048)",
        "vips tiffsave + tiffset (made once); tiler_bench io FILE --threads 1/2",
        "mb_per_second, windows_per_second", bench_slide),
    Row("tta", "--tta none / flip / d4, 1024 px, sample UNet, 2 threads",
        "tiler -i rgb_1024.tif -m sample.pt --threads 2 --tta T", "forward_seconds, seconds", bench_tta),
    Row("ctrun", "ctrun's own cost: starting and reaping 4 workers that do nothing",
        "ctrun --nproc_per_node 4 --master_port 0 true, 5 x RUNS times", "seconds", bench_ctrun),
    Row("finetune", "fine-tune steps on 1 and 2 ranks; tiler's loop against PyTorch's own (python_finetune.py, "
        "the same LibTorch), both from the first step",
        "ctrun --nproc_per_node 1/2 tiler finetune samples/train --epochs 2 --window 128 --batch_size 4; tiler "
        "finetune --epochs 5 --threads 1 --val_fraction 0 against python_finetune.py --warmup 0",
        "step_seconds, sync_share, steps_per_second, pytorch_steps_per_second", bench_finetune),
    Row("mask", "--mask auto on a slide with 20% tissue in one clump against no mask (the mask's cost included), "
        "and making the mask alone, 4096 px (--quick: 2048), sample UNet",
        "tiler --threads 2 --mask none/auto; tiler info SLIDE --mask auto",
        "seconds, windows_processed, time_ratio", bench_mask),
    Row("outputs", "what --pyramid, polygons and zarr cost against labels+probs (a pointwise threshold model); the "
        "output stage's capacity by what is saved (null model); 8 images on 1 and 2 ranks, 8192 px (--quick: 2048)",
        "tiler --threads 2 --batch_size 16 --save ...; tiler -m tiny.pt --save labels[,probs] [--probs_dtype "
        "f16|u8] [--compression none] [--write_threads 1]; ctrun --nproc_per_node 1/2 over 8 x 4096 px",
        "seconds, peak_rss_mb, windows_per_second, bytes_written, time_ratio, rss_ratio, rate_ratio, "
        "largest_byte_share", bench_outputs),
    Row("zarr", "probabilities as one OME-Zarr store against TIFFs: the output stage's capacity (8192 px, --quick: "
        "2048) and peak RSS (16384 px, --quick: 4096), null model",
        "tiler -m tiny.pt --save labels,probs | zarr [--probs_dtype u8]",
        "windows_per_second, bytes_written, files_written, rate_ratio, peak_rss_mb, rss_ratio", bench_zarr),
    Row("objects", "instance segmentation (the bundled blob labeller) against segment labels alone; peak RSS with "
        "10x the objects; 2 ranks against 1, 8192 px of discs (--quick: 2048)",
        "ctrun --nproc_per_node 1/2 tiler -m instances.pt --batch_size 16 --task instances --save "
        "objects,objects_csv,instances | --task segment --save labels",
        "seconds, time_ratio, peak_rss_mb, rss_ratio", bench_objects),
    Row("objects_store", "--save objects_store at scale: about a million discs and about 100 000 over 32768 px "
        "(--quick: 8192), one rank, default flags: the store's write time (the job with and without it), peak RSS "
        "(1M / 100k), the store's bytes against the GeoJSON's, SQLiteStore's bbox query of a 2000 px viewport",
        "tiler -m instances.pt --task instances --save objects[,objects_store]; sqlite3: SQLiteStore's bbox SQL",
        "seconds, peak_rss_mb, rss_ratio, bytes_written, size_ratio, query_seconds", bench_objects_store),
    Row("heads", "a three-head model (np, hv, tp) in one job against one head alone and against three single-head "
        "jobs, with and without probabilities, whole process",
        "tiler -i blobs_4096.tif (--quick: 1024 px) -m heads.pt --heads ... / --output_key np|hv|tp",
        "seconds, time_ratio, cpu_ratio", bench_heads),
    Row("codecs", "every --compression codec and level, with and without the predictor, over probabilities and "
        "labels as tiler writes them (random, textured, smooth): size ratio and one thread's MB/s",
        "tiler --compression none (made once), then tiler_bench codecs FILE --codecs $CODECS",
        "ratio, mb_per_s", bench_codecs),
    Row("embed", "tiler --task embed over an 8192 px slide (--quick: 2048) against the pure forward in tiler's "
        "layout and Python's: the bundled encoder, and torchvision's ResNet-18 where Debian's python has it",
        "tiler -m encoder.pt --window 256 | resnet18.pt --window 224; tiler_bench forward; python_forward.py",
        "seconds, overhead_ratio, windows_per_second", bench_embed),
    Row("view", "tiler view: IIIF tile latency over a pyramidal slide (input, labels, a class's probabilities; "
        "every power-of-two scale, cold then from the tile cache) and objects by viewport from a store of a "
        "million cells (--quick: 20000); the server's peak RSS",
        "vips tiffsave --pyramid of a 16384 px RGB (--quick: 2048); tiler -m tiny.pt --save labels,probs "
        "--pyramid; tiler view --port 0, requests one at a time", "p50_ms, p95_ms, peak_rss_mb", bench_view),
    Row("runtimes", "the same network as TorchScript and as a .pt2 package, whole process and pure forward "
        "(not in all: needs LibTorch 2.6+ and a python3 that exports packages; RUNTIMES_DEVICE=cuda on a GPU)",
        "TILER_BUILD_DIR=build-torch2 in scripts/test-torch2.sh's root; export_model.py, then tiler -m "
        "sample.pt | .pt2 over blobs_4096.tif (cuda: two 16384 px images, fp32)", "seconds, ratio",
        bench_runtimes, in_all=False),
    Row("gpu", "the whole process on CUDA against Python's pure forward of the same windows: UNet and "
        "fcn_resnet50, batch, precision, outputs, blended on the device or the host (not in all)",
        "tiler --device cuda over GPU_BENCH_IMAGES (4) x GPU_BENCH_SIZE (16384; --quick: 4096) px; python3 "
        "scripts/python_forward.py --device cuda", "seconds, overhead_ratio", bench_gpu, in_all=False),
    Row("python", "tiler.predict on a 4096 px array (--quick: 1024) against MONAI's sliding_window_inference "
        "written in plain PyTorch (MONAI is no Debian package: scripts/python_predict.py), same process, model, "
        "grid and gaussian, 2 threads each, a small conv net and the sample UNet; tiler.infer's whole process "
        "against the command's on the pipeline's job",
        "python_predict.py --size 4096 --threads 2 -m small_conv.pt | sample.pt; tiler -i blobs_4096.tif "
        "--threads 2 against python3 -c 'tiler.infer(...)'",
        "seconds, speedup, max_abs_difference, time_ratio", bench_python),
]


def summarize(figures, machine, path):
    """Median, min and max of every (scenario, metric) in the order first emitted: bench.json and a table."""
    values = {}
    for f in figures:
        values.setdefault((f["scenario"], f["metric"]), []).append(float(f["value"]))
    results = []
    print(f"{'scenario':<44} {'metric':<26} {'median':>12} {'min':>12} {'max':>12} {'n':>4}")
    for (scenario, metric), v in values.items():
        v.sort()
        k = len(v) // 2
        median = v[k] if len(v) % 2 else (v[k - 1] + v[k]) / 2
        results.append({"scenario": scenario, "metric": metric, "median": median, "min": v[0], "max": v[-1],
                        "runs": len(v)})
        print(f"{scenario:<44} {metric:<26} {median:12.4g} {v[0]:12.4g} {v[-1]:12.4g} {len(v):4d}")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".bench.json.")
    with os.fdopen(fd, "w") as out:
        json.dump({"machine": machine, "results": results}, out, indent=2, sort_keys=True)
        out.write("\n")
    os.replace(tmp, path)


def build():
    """Debian's packages and build/ with what the benches run (as scripts/test.sh builds)."""
    subprocess.run(["bash", "scripts/setup-deps.sh"], cwd=ROOT, check=True)
    subprocess.run(["cmake", "-S", ".", "-B", "build", "-G", "Ninja", "-DCMAKE_BUILD_TYPE=RelWithDebInfo",
                    "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", "build", "--target", "tiler", "ctrun", "tiler_bench"], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL)
    # The Python module, where this build has it (pybind11): the python bench skips itself without.
    subprocess.run(["cmake", "--build", "build", "--target", "tiler_python"], cwd=ROOT, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return ROOT / "build"


def list_rows(names):
    if not names:
        width = max(len(r.name) for r in BENCHES)
        for r in BENCHES:
            print(f"{r.name:<{width}}  {'all' if r.in_all else '   '}  {r.measures}")
        return 0
    for r in BENCHES:
        if r.name in names:
            print(f"{r.name}{'' if r.in_all else ' (not in all)'}\n  measures: {r.measures}\n  runs:     {r.runs}\n"
                  f"  reports:  {r.reports}")
    return 0


def main(argv):
    parser = argparse.ArgumentParser(prog="scripts/bench.sh", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 run on small inputs (RUNS is ignored)")
    parser.add_argument("--list", action="store_true", help="list the benches (with NAMEs: those in full)")
    parser.add_argument("names", nargs="*", metavar="NAME", help="benches to run, or all (the default)")
    args = parser.parse_args(argv)
    by_name = {r.name: r for r in BENCHES}
    unknown = [n for n in args.names if n != "all" and n not in by_name]
    if unknown:
        print(f"bench: no bench named {', '.join(unknown)}; the benches: {' '.join(by_name)} all", file=sys.stderr)
        return 2
    if args.list:
        return list_rows(args.names)
    wanted = args.names or ["all"]
    rows = [r for r in BENCHES if r.name in wanted or ("all" in wanted and r.in_all)]

    runs = 1 if args.quick else int(os.environ.get("RUNS", 3))
    # Relative paths are the repository's, as bench.sh's were.
    cache = ROOT / Path(os.environ.get("TILER_BENCH_CACHE") or Path.home() / ".cache/tiler-bench")
    results = ROOT / (os.environ.get("BENCH_RESULTS") or "bench-results")
    cache.mkdir(parents=True, exist_ok=True)
    results.mkdir(parents=True, exist_ok=True)
    build_dir = (ROOT / os.environ["TILER_BUILD_DIR"]).resolve() if os.environ.get("TILER_BUILD_DIR") else build()
    b = Bench(build_dir, cache, results, args.quick, runs)
    machine = b.machine()
    failed = []
    for row in rows:
        try:
            row.fn(b)
        except BenchError as e:
            print(f"bench {row.name}: {e}", file=sys.stderr)
            failed.append(row.name)
    b.lines.close()
    summarize(b.figures, machine, results / "bench.json")
    print(f"wrote {results / 'bench.json'}")
    if failed or b.missing:
        print(f"bench: failed: {' '.join(failed) or 'none'}; figures missing: {len(b.missing)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
