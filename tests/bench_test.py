#!/usr/bin/env python3
"""scripts/bench.sh (scripts/bench.py) as CI can afford it: its rows listed, a name it lacks refused, and its two
cheapest rows run small (`--quick ctrun io`: a few seconds) into a bench.json of the fields docs/performance.md
and scripts/gpu-build.sh read; a bench whose command fails stops alone.
Usage: bench_test.py BUILD_DIR (where tiler, ctrun and tiler_bench are)."""
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "scripts/bench.sh"
failures = []


def check(condition, what):
    if not condition:
        failures.append(what)
        print(f"FAILED: {what}", file=sys.stderr)


def bench(*args, env=None):
    return subprocess.run(["bash", str(BENCH), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=env, timeout=240)


def main(build_dir):
    listed = bench("--list")
    check(listed.returncode == 0, f"--list exits 0 (got {listed.returncode}: {listed.stderr})")
    names = [line.split()[0] for line in listed.stdout.splitlines() if line.strip()]
    for name in ("model", "light", "pipeline", "ceiling", "gather", "memory", "io", "ctrun", "finetune", "outputs",
                 "codecs", "embed", "view", "runtimes", "gpu", "python"):
        check(name in names, f"--list names the row {name}")
    row = bench("--list", "ctrun")
    check(row.returncode == 0 and all(f"{k}:" in row.stdout for k in ("measures", "runs", "reports")),
          f"--list ctrun gives what the row measures, how it runs and what it reports: {row.stdout!r}")
    unknown = bench("no_such_bench")
    check(unknown.returncode == 2 and "no_such_bench" in unknown.stderr, "an unknown bench is refused (exit 2)")

    with tempfile.TemporaryDirectory(prefix="bench_test.") as tmp:
        env = dict(os.environ, TILER_BUILD_DIR=str(Path(build_dir).resolve()), TILER_BENCH_CACHE=f"{tmp}/cache",
                   BENCH_RESULTS=f"{tmp}/results", RUNS="7")  # --quick ignores RUNS: 1 run
        run = bench("--quick", "ctrun", "io", env=env)
        check(run.returncode == 0, f"--quick ctrun io exits 0 (got {run.returncode}):\n{run.stdout}{run.stderr}")
        if run.returncode != 0:
            return
        doc = json.loads(Path(tmp, "results/bench.json").read_text())
        check(set(doc) == {"machine", "results"}, f"bench.json holds machine and results: {sorted(doc)}")
        check(set(doc["machine"]) == {"cores", "memory_gb", "cpu", "libtorch"},
              f"machine's fields: {sorted(doc['machine'])}")
        check(isinstance(doc["machine"]["cores"], int) and doc["machine"]["cores"] >= 1, "machine's cores")
        figures = {(r["scenario"], r["metric"]): r for r in doc["results"]}
        for r in doc["results"]:
            check(set(r) == {"scenario", "metric", "median", "min", "max", "runs"}, f"a result's fields: {r}")
            check(r["min"] <= r["median"] <= r["max"], f"min <= median <= max: {r}")
        io = "io: 2048px RGB tiled deflate, 256 px windows"
        expected = {("ctrun: --nproc_per_node 4 true", "seconds"): 5, (io, "mb_per_second"): 1,
                    (io, "peak_rss_mb"): 1, (io, "reader_rss_mb"): 1, (io, "reader_rss_share_of_image"): 1}
        check(set(figures) == set(expected), f"the figures of ctrun and io: {sorted(figures)}")
        for key, runs in expected.items():
            check(key in figures and figures[key]["runs"] == runs, f"{key} from {runs} run(s)")
        check(figures.get((io, "mb_per_second"), {}).get("median", 0) > 0, "io read something")
        lines = Path(tmp, "results/lines.jsonl").read_text().splitlines()
        check(len(lines) == 1 + 5 + 4 and all(isinstance(json.loads(l), dict) for l in lines),
              f"lines.jsonl: the machine and one line a figure ({len(lines)} lines)")
        check("wrote " in run.stdout and "scenario" in run.stdout, "the table is printed")

        # A bench whose command fails stops alone: the others' figures are written, and the exit status is 1.
        broken = Path(tmp, "broken")
        broken.mkdir()
        for tool in ("tiler", "ctrun"):
            (broken / tool).symlink_to(Path(build_dir).resolve() / tool)
        (broken / "tiler_bench").write_text("#!/bin/sh\necho 'broken on purpose' >&2\nexit 3\n")
        (broken / "tiler_bench").chmod(0o755)
        env.update(TILER_BUILD_DIR=str(broken), BENCH_RESULTS=f"{tmp}/broken-results")
        run = bench("--quick", "io", "ctrun", env=env)
        check(run.returncode == 1 and "bench io: exit 3" in run.stderr and "broken on purpose" in run.stderr,
              f"a failed bench is named with its command's exit and output:\n{run.stderr}")
        doc = json.loads(Path(tmp, "broken-results/bench.json").read_text())
        check([r["scenario"] for r in doc["results"]] == ["ctrun: --nproc_per_node 4 true"],
              f"the other bench's figures are written: {doc['results']}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
    print(f"bench_test: {'FAILED ' + str(len(failures)) if failures else 'ok'}")
    sys.exit(1 if failures else 0)
