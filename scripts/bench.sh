#!/usr/bin/env bash
# tiler's benchmarks: scripts/bench.py, one row a bench (`scripts/bench.sh --list`; usage: --help).
#   scripts/bench.sh [--quick] [NAME...]    e.g. RUNS=3 scripts/bench.sh pipeline; results in bench-results/
python=/usr/bin/python3
[ -x "$python" ] || python=python3
exec "$python" "$(dirname "$0")/bench.py" "$@"
