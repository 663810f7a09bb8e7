#!/usr/bin/env bash
# Benchmarks: scripts/bench.sh [--quick] [io|slide|tta|model|light|pipeline|blas|ceiling|gather|memory|scaling|ctrun|finetune|naive|mask|outputs|zarr|objects|codecs|heads|gpu|runtimes|all]
# Generates its own deterministic inputs (cached in $TILER_BENCH_CACHE, default ~/.cache/tiler-bench), runs each
# scenario $RUNS times (3; --quick: 1 run on small inputs), writes bench-results/bench.json and a table of
# medians (min-max). fp32 on the CPU. Never part of CI's test run.
# CODECS: the --compression values `codecs` tries (default: deflate 1/3/6/9, zstd 1/3/9, lzw, none).
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
if [ "${1:-}" = "--quick" ]; then quick=1; shift; fi
what="${1:-all}"
runs=${RUNS:-3}
[ $quick = 1 ] && runs=1
cache="${TILER_BENCH_CACHE:-$HOME/.cache/tiler-bench}"
results="${BENCH_RESULTS:-bench-results}"
mkdir -p "$cache" "$results"
# TILER_BUILD_DIR: an existing build (scripts/gpu-build.sh's, on a machine without Debian's packages).
if [ -n "${TILER_BUILD_DIR:-}" ]; then
  bin=$(realpath "$TILER_BUILD_DIR")
else
  bash scripts/setup-deps.sh
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER_LAUNCHER=ccache >/dev/null
  cmake --build build --target tiler ctrun tiler_bench >/dev/null
  bin="$PWD/build"
fi
model="$PWD/samples/models/sample.pt"
lines="$results/lines.jsonl"
: >"$lines"

emit() { printf '{"scenario": "%s", "metric": "%s", "value": %s}\n' "$1" "$2" "$3" >>"$lines"; }
json() { sed -n "s/.*\"$2\": *\([-0-9.e+]*\).*/\1/p" <<<"$1" | head -1; }  # field of a one-line JSON
report_field() { tr -d ' \n' <"$1" | grep -o "\"$2\":[-0-9.e+]*" | head -"${3:-1}" | tail -1 | cut -d: -f2; }
now() { date +%s.%N; }
sum_field() { tr -d ' \n' <"$1" | grep -o "\"$2\":[-0-9.e+]*" | cut -d: -f2 | awk '{ s += $1 } END { print s }'; }
max_field() { tr -d ' \n' <"$1" | grep -o "\"$2\":[-0-9.e+]*" | cut -d: -f2 | sort -g | tail -1; }
# rss_split CMD...: runs CMD, sampling its /proc status every 50 ms; prints "PEAK_ANON_MB PEAK_FILE_MB" (resident
# anonymous memory, and file pages such as a memory-mapped input: the two that VmHWM adds up).
rss_split() {
  "$@" >/dev/null 2>&1 &
  local pid=$! anon=0 file=0 a f
  while kill -0 "$pid" 2>/dev/null; do
    # The process may end between the test and the reads: an empty sample, not an error.
    a=$(awk '/^RssAnon:/ { print $2 }' "/proc/$pid/status" 2>/dev/null || true)
    f=$(awk '/^RssFile:/ { print $2 }' "/proc/$pid/status" 2>/dev/null || true)
    [ -n "$a" ] && [ "$a" -gt "$anon" ] && anon=$a
    [ -n "$f" ] && [ "$f" -gt "$file" ] && file=$f
    sleep 0.05
  done
  wait "$pid" || true  # a failed run shows as a missing report
  echo "$((anon / 1024)) $((file / 1024))"
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.4f", a / b }'; }
image() {  # image SIZE -> path of a cached square RGB tiled deflate TIFF
  local f="$cache/rgb_$1.tif"
  [ -f "$f" ] || "$bin/tiler_bench" make "$f" --size "$1"
  echo "$f"
}
tiny="$cache/tiny.pt"
[ -f "$tiny" ] || "$bin/tiler_bench" tiny-model "$tiny"
printf '{"machine": {"cores": %s, "memory_gb": %s, "cpu": "%s", "libtorch": "%s"}}\n' "$(nproc)" \
  "$(awk '/MemTotal/ {printf "%.0f", $2/1048576}' /proc/meminfo)" \
  "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')" \
  "$("$bin/tiler" --version | sed -n 's/LibTorch: //p')" >>"$lines"

want() { [ "$what" = all ] || [ "$what" = "$1" ]; }
sample="$PWD/samples/images/blobs_4096.tif"
pipeline_windows=441  # 4096 x 4096, 256 px windows, 25% overlap
if [ $quick = 1 ]; then sample="$(image 1024)"; pipeline_windows=25; fi

if want model; then
  for b in 1 4 8 16; do
    for p in fp32 bf16; do
      for _ in $(seq "$runs"); do
        out=$("$bin/tiler_bench" forward -m "$model" --batch_size $b --precision $p --windows 64 --threads 2)
        emit "model: forward batch $b $p" windows_per_second "$(json "$out" windows_per_second)"
      done
    done
  done
fi

# LibTorch 1.13 gives a 1x1 convolution to oneDNN when it runs on more than one intra-op thread or on a batch of 16
# or more (ConvParams::use_mkldnn), and for 3 input channels oneDNN's layout conversions cost far more than the
# convolution: the null model's forward in tiler's C++ and in Python on the same LibTorch, by threads and batch.
if want light; then
  for _ in $(seq "$runs"); do
    for cfg in 1:8 2:8 1:16; do
      t=${cfg%:*} b=${cfg#*:}
      out=$("$bin/tiler_bench" forward -m "$tiny" --windows 160 --threads "$t" --batch_size "$b")
      emit "light: null model forward, $t thread(s), batch $b, C++" windows_per_second "$(json "$out" windows_per_second)"
      if /usr/bin/python3 -c "import torch" 2>/dev/null; then
        out=$(/usr/bin/python3 scripts/python_forward.py -m "$tiny" --windows 160 --threads "$t" --batch_size "$b")
        emit "light: null model forward, $t thread(s), batch $b, Python" windows_per_second \
          "$(json "$out" windows_per_second)"
      fi
    done
  done
fi

if want pipeline; then
  for _ in $(seq "$runs"); do
    out=$("$bin/tiler_bench" forward -m "$model" --windows $pipeline_windows --threads 2)
    pure=$(json "$out" seconds)
    rm -rf "$cache/out_pipeline"
    t0=$(now)
    "$bin/tiler" -i "$sample" -m "$model" -o "$cache/out_pipeline" --threads 2 --no_progress >/dev/null 2>&1
    t1=$(now)
    e2e=$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')
    emit "pipeline: pure forward ($pipeline_windows windows)" seconds "$pure"
    emit "pipeline: tiler 1 rank x 2 threads" seconds "$e2e"
    emit "pipeline: tiler / pure forward" overhead_ratio "$(ratio "$e2e" "$pure")"
    # The same job with default flags (threads, ...), against the pure forward in Python when python3-torch
    # (Debian's, the same LibTorch) is installed: the outside yardstick.
    rm -rf "$cache/out_pipeline"
    t0=$(now)
    "$bin/tiler" -i "$sample" -m "$model" -o "$cache/out_pipeline" --no_progress >/dev/null 2>&1
    t1=$(now)
    default=$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')
    emit "pipeline: tiler 1 rank, default flags" seconds "$default"
    r="$cache/out_pipeline/report.json"
    emit "pipeline: tiler 1 rank, default flags" replicas "$(report_field "$r" replicas)"
    emit "pipeline: tiler 1 rank, default flags" threads_per_replica "$(report_field "$r" threads)"
    # The pure forward in the same layout (replicas x threads), the C++ yardstick of the default run.
    out=$("$bin/tiler_bench" forward -m "$model" --windows $pipeline_windows \
      --replicas "$(report_field "$r" replicas)" --threads "$(report_field "$r" threads)")
    emit "pipeline: pure forward in tiler's default layout" seconds "$(json "$out" seconds)"
    emit "pipeline: tiler default flags / pure forward in its layout" overhead_ratio \
      "$(ratio "$default" "$(json "$out" seconds)")"
    # The opt-in --jit_optimize (freeze + optimize_for_inference: convolutions keep oneDNN's blocked layout
    # from one to the next instead of converting to NCHW and back around each), default flags otherwise.
    rm -rf "$cache/out_pipeline"
    t0=$(now)
    "$bin/tiler" -i "$sample" -m "$model" -o "$cache/out_pipeline" --no_progress --jit_optimize >/dev/null 2>&1
    optimized=$(awk -v a="$t0" -v b="$(now)" 'BEGIN { print b - a }')
    emit "pipeline: tiler 1 rank, default flags, --jit_optimize" seconds "$optimized"
    emit "pipeline: tiler --jit_optimize / default flags" time_ratio "$(ratio "$optimized" "$default")"
    if /usr/bin/python3 -c "import torch" 2>/dev/null; then
      out=$(/usr/bin/python3 scripts/python_forward.py -m "$model" --windows $pipeline_windows --threads 2)
      py=$(json "$out" seconds)
      emit "pipeline: pure forward in Python, 2 threads ($pipeline_windows windows)" seconds "$py"
      emit "pipeline: tiler default flags / Python pure forward" overhead_ratio "$(ratio "$default" "$py")"
      emit "pipeline: tiler 1 rank x 2 threads / Python pure forward" overhead_ratio "$(ratio "$e2e" "$py")"
      # The same optimisation in Python: the yardstick of the --jit_optimize run.
      out=$(/usr/bin/python3 scripts/python_forward.py -m "$model" --windows $pipeline_windows --threads 2 --optimize)
      pyopt=$(json "$out" seconds)
      emit "pipeline: pure forward in Python, 2 threads, frozen + optimize_for_inference" seconds "$pyopt"
      emit "pipeline: tiler --jit_optimize / Python frozen pure forward" overhead_ratio "$(ratio "$optimized" "$pyopt")"
      emit "pipeline: Python frozen / Python as loaded" time_ratio "$(ratio "$pyopt" "$py")"
    fi
  done
fi

# LibTorch's CPU convolutions go through libblas.so.3: the BLAS setup-deps installs (OpenBLAS) against Debian's
# reference BLAS (libblas3), put first on the library path; the same windows, pure forward and whole process.
if want blas; then
  reference="/usr/lib/$(gcc -print-multiarch)/blas"
  if [ -f "$reference/libblas.so.3" ]; then
    for _ in $(seq "$runs"); do
      declare -A fwd=() e2e=()
      for cfg in installed reference; do
        lp=""
        [ $cfg = reference ] && lp="$reference"
        out=$(LD_LIBRARY_PATH="$lp" "$bin/tiler_bench" forward -m "$model" --windows $pipeline_windows \
          --replicas 2 --threads 1)
        fwd[$cfg]=$(json "$out" seconds)
        emit "blas: pure forward 2 x 1, $cfg BLAS" seconds "${fwd[$cfg]}"
        rm -rf "$cache/out_blas"
        t0=$(now)
        LD_LIBRARY_PATH="$lp" "$bin/tiler" -i "$sample" -m "$model" -o "$cache/out_blas" --no_progress \
          >/dev/null 2>&1
        e2e[$cfg]=$(awk -v a="$t0" -v b="$(now)" 'BEGIN { print b - a }')
        emit "blas: tiler default flags, $cfg BLAS" seconds "${e2e[$cfg]}"
      done
      emit "blas: pure forward, reference / installed" time_ratio "$(ratio "${fwd[reference]}" "${fwd[installed]}")"
      emit "blas: tiler default flags, reference / installed" time_ratio "$(ratio "${e2e[reference]}" "${e2e[installed]}")"
    done
  fi
fi

if want scaling; then
  for _ in $(seq "$runs"); do
    declare -A wps=()
    for cfg in 1:2 2:1 3:1 4:1; do
      n=${cfg%:*} t=${cfg#*:}
      rm -rf "$cache/out_scaling"
      "$bin/ctrun" --nproc_per_node "$n" --master_port 0 "$bin/tiler" -i "$sample" -m "$model" \
        -o "$cache/out_scaling" --threads "$t" --no_progress >/dev/null 2>&1
      wps[$cfg]=$(report_field "$cache/out_scaling/report.json" windows_per_second)
      emit "scaling: $n rank(s) x $t thread(s)" windows_per_second "${wps[$cfg]}"
    done
    emit "scaling: (2 x 1) / (1 x 2)" throughput_ratio "$(ratio "${wps[2:1]}" "${wps[1:2]}")"
  done
fi

# The ceiling: a null model (1x1 convolution) on an 8192 px tiled deflate TIFF, where reading, exchange and
# writing are all there is. 1 rank with default flags, the same reading on one thread (--read_threads 1, the
# reading before the decode pool), 1 rank x 2 threads, 1 x 1, 2 x 1.
if want ceiling; then
  img=$(image 8192)
  [ $quick = 1 ] && img=$(image 2048)
  for _ in $(seq "$runs"); do
    declare -A wall=() cpu=() read_sum=()
    for cfg in 1:default 1:read1 1:2 1:1 2:1 2:sockets; do
      n=${cfg%:*} t=${cfg#*:}
      threads=(--threads "$t")
      [ "$t" = default ] && threads=()
      [ "$t" = read1 ] && threads=(--read_threads 1)
      label="$n rank(s) x $t thread(s)"
      if [ "$t" = sockets ]; then  # the gather through gloo's TCP
        threads=(--threads 1 --no_shared_memory)
        label="$n rank(s) x 1 thread(s), gather through sockets"
      fi
      rm -rf "$cache/out_ceiling"
      # bash's time keyword: wall, and the user + system CPU of ctrun and every rank it waited for.
      read -r wall[$cfg] user sys < <({ TIMEFORMAT='%R %U %S'; time "$bin/ctrun" --nproc_per_node "$n" \
        --master_port 0 "$bin/tiler" -i "$img" -m "$tiny" -o "$cache/out_ceiling" "${threads[@]}" --no_progress \
        >/dev/null 2>&1; } 2>&1)
      cpu[$cfg]=$(awk -v u="$user" -v s="$sys" 'BEGIN { print u + s }')
      r="$cache/out_ceiling/report.json"
      read_sum[$cfg]=$(sum_field "$r" read_seconds)
      emit "ceiling: null model, $label" seconds "${wall[$cfg]}"
      emit "ceiling: null model, $label" cpu_seconds "${cpu[$cfg]}"
      emit "ceiling: null model, $label" windows_per_second \
        "$(ratio "$(report_field "$r" windows)" "${wall[$cfg]}")"
      # The same from tiler's main() on: without loading the libraries (Debian's libtorch_cpu links 285).
      emit "ceiling: null model, $label" windows_per_second_after_start \
        "$(report_field "$r" windows_per_second)"
      emit "ceiling: null model, $label" summed_read_seconds "${read_sum[$cfg]}"
      emit "ceiling: null model, $label" summed_tiles_decoded "$(sum_field "$r" tiles_decoded)"
      emit "ceiling: null model, $label" forward_seconds "$(max_field "$r" forward_seconds)"
      emit "ceiling: null model, $label" gather_seconds "$(max_field "$r" gather_seconds)"
    done
    t0=$(now)
    "$bin/tiler" --version >/dev/null
    emit "ceiling: process start and exit (tiler --version)" seconds "$(awk -v a="$t0" -v b="$(now)" 'BEGIN { print b - a }')"
    emit "ceiling: wall 1 rank default / the same with --read_threads 1" ratio "$(ratio "${wall[1:default]}" "${wall[1:read1]}")"
    emit "ceiling: wall 2 x 1 / 1 rank default" ratio "$(ratio "${wall[2:1]}" "${wall[1:default]}")"
    # What bounds that ratio on a machine with as many cores as ranks: 2 ranks can finish in 1 rank's wall
    # only if all they compute fits in it, cores x 1 rank's wall CPU seconds.
    emit "ceiling: CPU seconds 2 x 1 / 1 rank default" ratio "$(ratio "${cpu[2:1]}" "${cpu[1:default]}")"
    emit "ceiling: CPU seconds 2 x 1 / (cores x wall of 1 rank default)" ratio \
      "$(awk -v c="${cpu[2:1]}" -v w="${wall[1:default]}" -v n="$(nproc)" 'BEGIN { printf "%.4f", c / (n * w) }')"
    emit "ceiling: wall 2 x 1 / 1 x 2" ratio "$(ratio "${wall[2:1]}" "${wall[1:2]}")"
    emit "ceiling: wall 2 x 1, gather through shared memory / through gloo's sockets" ratio \
      "$(ratio "${wall[2:1]}" "${wall[2:sockets]}")"
    emit "ceiling: summed read seconds 2 x 1 / 1 x 2" ratio "$(ratio "${read_sum[2:1]}" "${read_sum[1:2]}")"
    emit "ceiling: summed read seconds 2 x 1 / 1 rank default" ratio "$(ratio "${read_sum[2:1]}" "${read_sum[1:default]}")"
  done
fi

# The step gather alone (tiler_bench gather: ranks as processes, each sends one batch of predictions, 4 MiB:
# batch 8, 2 channels, 256 px, fp32): through rank 0's shared memory vs gloo's sockets on loopback.
if want gather; then
  for _ in $(seq "$runs"); do
    for n in 2 4; do
      declare -A per=()
      for how in shared_memory sockets; do
        flag=()
        [ "$how" = sockets ] && flag=(--no_shared_memory)
        out=$("$bin/ctrun" --nproc_per_node "$n" --master_port 0 "$bin/tiler_bench" gather --mib 4 --gathers 100 \
          "${flag[@]}" 2>/dev/null | grep ms_per_gather)
        per[$how]=$(json "$out" ms_per_gather)
        emit "gather: $n ranks, 4 MiB a rank, through $how" ms_per_gather "${per[$how]}"
      done
      emit "gather: $n ranks, shared memory / sockets" ratio "$(ratio "${per[shared_memory]}" "${per[sockets]}")"
    done
  done
fi

sizes="4096 8192 16384 32768"
[ $quick = 1 ] && sizes="2048"
if want memory; then
  for n in $sizes; do
    img=$(image "$n")
    for _ in $(seq "$runs"); do
      rm -rf "$cache/out_memory"
      "$bin/ctrun" --nproc_per_node 2 --master_port 0 "$bin/tiler" -i "$img" -m "$tiny" -o "$cache/out_memory" \
        --threads 1 --batch_size 16 --no_progress >/dev/null 2>&1
      emit "memory: ${n}px RGB, 2 ranks" rank0_peak_rss_mb "$(report_field "$cache/out_memory/report.json" peak_rss_mb 1)"
      emit "memory: ${n}px RGB, 2 ranks" rank1_peak_rss_mb "$(report_field "$cache/out_memory/report.json" peak_rss_mb 2)"
      emit "memory: ${n}px RGB, 2 ranks" seconds "$(report_field "$cache/out_memory/report.json" seconds)"
      rm -rf "$cache/out_memory"
      read -r anon file < <(rss_split "$bin/tiler" -i "$img" -m "$tiny" -o "$cache/out_memory" --threads 1 \
        --batch_size 16 --no_progress)
      emit "memory: ${n}px RGB, 1 rank" peak_rss_mb "$(report_field "$cache/out_memory/report.json" peak_rss_mb 1)"
      emit "memory: ${n}px RGB, 1 rank" peak_anon_mb "$anon"
      emit "memory: ${n}px RGB, 1 rank" peak_file_mb "$file"
    done
  done
fi

if want naive; then
  naive_sizes="4096 8192"
  [ $quick = 1 ] && naive_sizes="2048"
  for n in $naive_sizes; do
    img=$(image "$n")
    for _ in $(seq "$runs"); do
      out=$("$bin/tiler_bench" naive "$img" -m "$tiny" --threads 2 --batch_size 16)
      emit "naive (whole image, full accumulators): ${n}px" peak_rss_mb "$(json "$out" peak_rss_mb)"
      emit "naive (whole image, full accumulators): ${n}px" seconds "$(json "$out" seconds)"
      rm -rf "$cache/out_naive"
      "$bin/tiler" -i "$img" -m "$tiny" -o "$cache/out_naive" --threads 2 --batch_size 16 --no_progress >/dev/null 2>&1
      emit "tiler (same job, 1 rank): ${n}px" peak_rss_mb "$(report_field "$cache/out_naive/report.json" peak_rss_mb)"
      emit "tiler (same job, 1 rank): ${n}px" seconds "$(report_field "$cache/out_naive/report.json" seconds)"
    done
  done
fi

if want io; then
  n=16384
  [ $quick = 1 ] && n=2048
  img=$(image $n)
  for _ in $(seq "$runs"); do
    out=$("$bin/tiler_bench" io "$img" --window 256 --overlap 0.25)
    emit "io: ${n}px RGB tiled deflate, 256 px windows" mb_per_second "$(json "$out" mb_per_second)"
    emit "io: ${n}px RGB tiled deflate, 256 px windows" peak_rss_mb "$(json "$out" peak_rss_mb)"
    emit "io: ${n}px RGB tiled deflate, 256 px windows" reader_rss_mb "$(json "$out" reader_rss_mb)"
    emit "io: ${n}px RGB tiled deflate, 256 px windows" reader_rss_share_of_image "$(json "$out" reader_rss_share_of_image)"
  done
fi

if want slide; then
  # The same JPEG tiles (quality 90, 256 px, libvips pyramid) read as an Aperio slide through OpenSlide and
  # as a plain TIFF through tiler's libtiff reader, by 1 and 2 threads.
  n=8192
  [ $quick = 1 ] && n=2048
  plain="$cache/slide_$n.tif" svs="$cache/slide_$n.svs"
  if [ ! -f "$svs" ]; then
    vips tiffsave "$(image $n)" "$plain" --compression jpeg --Q 90 --tile --tile-width 256 --tile-height 256 --pyramid
    cp "$plain" "$svs"
    tiffset -d 0 -s 270 "Aperio Image Library v12.0.5
${n}x${n} [0,0 ${n}x${n}] (256x256) JPEG/RGB Q=90|AppMag = 40|MPP = 0.25" "$svs"
  fi
  for _ in $(seq "$runs"); do
    for file in "$svs" "$plain"; do
      for threads in 1 2; do
        out=$("$bin/tiler_bench" io "$file" --window 256 --overlap 0.25 --threads $threads)
        reader=$(sed -n 's/.*"reader": *"\([a-z]*\)".*/\1/p' <<<"$out")
        name="slide: ${n}px JPEG, $reader reader, $threads thread(s)"
        emit "$name" mb_per_second "$(json "$out" mb_per_second)"
        emit "$name" windows_per_second "$(json "$out" windows_per_second)"
      done
    done
  done
fi

if want tta; then
  img=$(image 1024)
  for _ in $(seq "$runs"); do
    for t in none flip d4; do
      rm -rf "$cache/out_tta"
      "$bin/tiler" -i "$img" -m "$model" -o "$cache/out_tta" --threads 2 --no_progress --tta $t >/dev/null 2>&1
      emit "tta: $t, 1024 px, sample UNet, 2 threads" forward_seconds "$(report_field "$cache/out_tta/report.json" forward_seconds)"
      emit "tta: $t, 1024 px, sample UNet, 2 threads" seconds "$(report_field "$cache/out_tta/report.json" seconds)"
    done
  done
fi

if want ctrun; then
  for _ in $(seq $((runs * 5))); do
    t0=$(now)
    "$bin/ctrun" --nproc_per_node 4 --master_port 0 true
    t1=$(now)
    emit "ctrun: --nproc_per_node 4 true" seconds "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')"
  done
fi

if want finetune; then
  for _ in $(seq "$runs"); do
    for n in 1 2; do
      rm -rf "$cache/ft"
      "$bin/ctrun" --nproc_per_node $n --master_port 0 "$bin/tiler" finetune --images samples/train/images \
        --labels samples/train/labels -m samples/models/init.pt -o "$cache/ft/out.pt" --epochs 2 --window 128 \
        --batch_size 4 --threads $((2 / n)) --no_progress >/dev/null 2>&1
      r="$cache/ft/out.pt.report.json"
      steps=$(report_field "$r" steps)
      step=$(report_field "$r" step_seconds)
      sync=$(report_field "$r" sync_seconds)
      emit "finetune: $n rank(s), batch 4/rank" step_seconds "$(ratio "$step" "$steps")"
      emit "finetune: $n rank(s), batch 4/rank" sync_share "$(ratio "$sync" "$step")"
    done
  done
  # PyTorch's own training loop (scripts/python_finetune.py: windows in memory, the same model, batch, Adam
  # and threads) against tiler's steps, reading and the all-reduce included: tiler's steps/s and PyTorch's, both
  # over every step from the first (--warmup 0: tiler's step_seconds count the first, profiling runs too).
  if /usr/bin/python3 -c "import torch" 2>/dev/null; then
    for _ in $(seq "$runs"); do
      rm -rf "$cache/ft1"
      "$bin/tiler" finetune --images samples/train/images --labels samples/train/labels -m samples/models/init.pt \
        -o "$cache/ft1/out.pt" --epochs 5 --window 128 --overlap 0 --batch_size 4 --threads 1 --val_fraction 0 \
        --no_progress >/dev/null 2>&1
      r="$cache/ft1/out.pt.report.json"
      steps=$(report_field "$r" steps)
      out=$(/usr/bin/python3 scripts/python_finetune.py -m samples/models/init.pt --steps "$steps" --window 128 \
        --batch_size 4 --threads 1 --warmup 0)
      emit "finetune vs PyTorch's loop: 1 rank, batch 4, 1 thread" steps_per_second \
        "$(ratio "$steps" "$(report_field "$r" step_seconds)")"
      emit "finetune vs PyTorch's loop: 1 rank, batch 4, 1 thread" pytorch_steps_per_second \
        "$(json "$out" steps_per_second)"
    done
  fi
fi

if want mask; then
  # A slide with about 20% tissue, the UNet-like sample model (the forward dominates): masked vs unmasked wall
  # time, the mask's own cost included; and the cost of making the mask alone (tiler info --mask auto).
  n=4096
  [ $quick = 1 ] && n=2048
  slide="$cache/slide_${n}_20.tif"
  [ -f "$slide" ] || "$bin/tiler_bench" make "$slide" --size "$n" --tissue 0.2
  for _ in $(seq "$runs"); do
    declare -A wall=()
    for m in none auto; do
      rm -rf "$cache/out_mask"
      t0=$(now)
      "$bin/tiler" -i "$slide" -m "$model" -o "$cache/out_mask" --threads 2 --mask "$m" --no_progress >/dev/null 2>&1
      wall[$m]=$(awk -v a="$t0" -v b="$(now)" 'BEGIN { print b - a }')
      emit "mask: ${n}px slide, 20% tissue, --mask $m" seconds "${wall[$m]}"
    done
    emit "mask: ${n}px slide, 20% tissue" windows_processed "$(report_field "$cache/out_mask/report.json" windows_processed)"
    emit "mask: ${n}px slide, masked / unmasked" time_ratio "$(ratio "${wall[auto]}" "${wall[none]}")"
    t0=$(now)
    "$bin/tiler" info "$slide" --mask auto >/dev/null
    emit "mask: making the auto mask of a ${n}px slide (tiler info)" seconds "$(awk -v a="$t0" -v b="$(now)" 'BEGIN { print b - a }')"
  done
fi

if want outputs; then
  # What --pyramid and polygons cost on an 8192 px job (1 rank, 2 threads, a pointwise threshold model so that
  # writing shows and the labels have ~1000 blob regions): wall time and peak RSS against labels+probs alone.
  n=8192
  [ $quick = 1 ] && n=2048
  img=$(image "$n")
  threshold="$cache/threshold.pt"
  [ -f "$threshold" ] || "$bin/tiler_bench" tiny-model "$threshold" --threshold
  for _ in $(seq "$runs"); do
    declare -A secs=() rss=()
    for cfg in plain pyramid polygons zarr; do
      extra="--save labels,probs"
      [ $cfg = pyramid ] && extra="--save labels,probs --pyramid"
      [ $cfg = polygons ] && extra="--save labels,probs,polygons"
      [ $cfg = zarr ] && extra="--save zarr"  # the same labels and probabilities, as one OME-Zarr store
      rm -rf "$cache/out_outputs"
      "$bin/tiler" -i "$img" -m "$threshold" -o "$cache/out_outputs" --threads 2 --batch_size 16 $extra --no_progress \
        >/dev/null 2>&1
      secs[$cfg]=$(report_field "$cache/out_outputs/report.json" seconds)
      rss[$cfg]=$(report_field "$cache/out_outputs/report.json" peak_rss_mb)
      emit "outputs: ${n}px, labels+probs, $cfg" seconds "${secs[$cfg]}"
      emit "outputs: ${n}px, labels+probs, $cfg" peak_rss_mb "${rss[$cfg]}"
      emit "outputs: ${n}px, labels+probs, $cfg" windows_per_second \
        "$(report_field "$cache/out_outputs/report.json" windows_per_second)"
      emit "outputs: ${n}px, labels+probs, $cfg" bytes_written "$(du -sb --exclude=report.json "$cache/out_outputs" | cut -f1)"
    done
    for cfg in pyramid polygons zarr; do
      emit "outputs: ${n}px, $cfg / plain" time_ratio "$(ratio "${secs[$cfg]}" "${secs[plain]}")"
      emit "outputs: ${n}px, $cfg / plain" rss_ratio "$(ratio "${rss[$cfg]}" "${rss[plain]}")"
    done
  done
  # The output stage's capacity: the null model (its forward costs next to nothing), 1 rank, windows/s by what
  # is saved, how probabilities are stored and how many threads compress; then 8 images on 1 and 2 ranks, and
  # the share of the bytes each rank wrote (its owned images).
  for _ in $(seq "$runs"); do
    declare -A wps=()
    for cfg in labels probs probs:f16 probs:u8 probs:none probs:w1; do
      extra="--save labels"
      case $cfg in
        probs) extra="--save labels,probs" ;;
        probs:f16) extra="--save labels,probs --probs_dtype f16" ;;
        probs:u8) extra="--save labels,probs --probs_dtype u8" ;;
        probs:none) extra="--save labels,probs --compression none" ;;
        probs:w1) extra="--save labels,probs --write_threads 1" ;;
      esac
      rm -rf "$cache/out_capacity"
      "$bin/tiler" -i "$img" -m "$tiny" -o "$cache/out_capacity" $extra --no_progress >/dev/null 2>&1
      wps[$cfg]=$(report_field "$cache/out_capacity/report.json" windows_per_second)
      emit "outputs: ${n}px null model, $cfg" windows_per_second "${wps[$cfg]}"
      emit "outputs: ${n}px null model, $cfg" peak_rss_mb "$(report_field "$cache/out_capacity/report.json" peak_rss_mb)"
    done
    for cfg in probs probs:f16 probs:u8; do
      emit "outputs: ${n}px null model, $cfg / labels" rate_ratio "$(ratio "${wps[$cfg]}" "${wps[labels]}")"
    done
    m=4096
    [ $quick = 1 ] && m=1024
    many="$cache/many_$m"
    mkdir -p "$many"
    for k in 1 2 3 4 5 6 7 8; do [ -e "$many/img$k.tif" ] || ln -s "$(image "$m")" "$many/img$k.tif"; done
    for nproc in 1 2; do
      rm -rf "$cache/out_many"
      "$bin/ctrun" --nproc_per_node $nproc --master_port 0 "$bin/tiler" -i "$many" -m "$tiny" -o "$cache/out_many" \
        --save labels,probs --no_progress >/dev/null 2>&1
      emit "outputs: 8 x ${m}px null model, $nproc rank(s)" windows_per_second \
        "$(report_field "$cache/out_many/report.json" windows_per_second)"
      total=$(sum_field "$cache/out_many/report.json" bytes_written)
      emit "outputs: 8 x ${m}px null model, $nproc rank(s)" largest_byte_share \
        "$(ratio "$(max_field "$cache/out_many/report.json" bytes_written)" "$total")"
    done
  done
fi

if want zarr; then
  # The probabilities as one OME-Zarr store against the same labels and probabilities as TIFFs: the output
  # stage's capacity on the 8192 px null-model job (1 rank: windows/s and bytes on disk, by probability dtype),
  # then peak RSS on a 16384 px image (the writers stream band by band: the store may not hold more).
  n=8192
  [ $quick = 1 ] && n=2048
  img=$(image "$n")
  for _ in $(seq "$runs"); do
    declare -A wps=()
    for cfg in tiff zarr tiff:u8 zarr:u8; do
      save="--save labels,probs"
      [[ $cfg = zarr* ]] && save="--save zarr"
      dtype=""
      [[ $cfg = *:u8 ]] && dtype="--probs_dtype u8"
      rm -rf "$cache/out_zarr"
      "$bin/tiler" -i "$img" -m "$tiny" -o "$cache/out_zarr" $save $dtype --no_progress >/dev/null 2>&1
      wps[$cfg]=$(report_field "$cache/out_zarr/report.json" windows_per_second)
      emit "zarr: ${n}px null model, $cfg" windows_per_second "${wps[$cfg]}"
      emit "zarr: ${n}px null model, $cfg" bytes_written "$(du -sb --exclude=report.json "$cache/out_zarr" | cut -f1)"
      emit "zarr: ${n}px null model, $cfg" files_written "$(find "$cache/out_zarr" -type f ! -name report.json | wc -l)"
    done
    emit "zarr: ${n}px null model, zarr / tiff" rate_ratio "$(ratio "${wps[zarr]}" "${wps[tiff]}")"
    emit "zarr: ${n}px null model, zarr:u8 / tiff:u8" rate_ratio "$(ratio "${wps[zarr:u8]}" "${wps[tiff:u8]}")"
  done
  m=16384
  [ $quick = 1 ] && m=4096
  big=$(image "$m")
  declare -A rss=()
  for cfg in tiff zarr; do
    save="--save labels,probs"
    [ $cfg = zarr ] && save="--save zarr"
    rm -rf "$cache/out_zarr"
    "$bin/tiler" -i "$big" -m "$tiny" -o "$cache/out_zarr" $save --no_progress >/dev/null 2>&1
    rss[$cfg]=$(report_field "$cache/out_zarr/report.json" peak_rss_mb)
    emit "zarr: ${m}px null model, $cfg" peak_rss_mb "${rss[$cfg]}"
  done
  emit "zarr: ${m}px null model, zarr / tiff" rss_ratio "$(ratio "${rss[zarr]}" "${rss[tiff]}")"
fi

if want objects; then
  # Instance segmentation (--task instances, the bundled blob labeller) over an 8192^2 image of one disc every
  # PITCH px: the whole process against the same job's --task segment with labels only (the ids' map stitched
  # as labels: the same forward and exchange, no objects); peak RSS with 10x the objects (flat: objects are
  # written as they come); 2 ranks against 1.
  n=8192
  [ $quick = 1 ] && n=2048
  instances="$PWD/samples/models/instances.pt"
  discs() {  # discs PITCH -> a cached image
    local f="$cache/discs_${n}_$1.tif"
    [ -f "$f" ] || "$bin/tiler_bench" make "$f" --size "$n" --discs "$1"
    echo "$f"
  }
  objects_run() {  # objects_run IMAGE NPROC FLAGS... -> "seconds peak_rss_mb objects"
    rm -rf "$cache/out_objects"
    "$bin/ctrun" --nproc_per_node "$2" --master_port 0 "$bin/tiler" -i "$1" -m "$instances" \
      -o "$cache/out_objects" --batch_size 16 --no_progress "${@:3}" >/dev/null 2>&1
    echo "$(report_field "$cache/out_objects/report.json" seconds) $(max_field "$cache/out_objects/report.json" \
      peak_rss_mb) $(report_field "$cache/out_objects/report.json" objects)"
  }
  for _ in $(seq "$runs"); do
    img=$(discs 36)
    read -r seg_s seg_rss _ <<<"$(objects_run "$img" 1 --task segment --save labels)"
    read -r ins_s ins_rss count <<<"$(objects_run "$img" 1 --task instances --save objects,objects_csv,instances)"
    emit "objects: ${n}px, $count discs, segment labels" seconds "$seg_s"
    emit "objects: ${n}px, $count discs, instances objects+csv+tiff" seconds "$ins_s"
    emit "objects: ${n}px, $count discs, instances / segment labels" time_ratio "$(ratio "$ins_s" "$seg_s")"
    emit "objects: ${n}px, $count discs, instances" peak_rss_mb "$ins_rss"
    read -r two_s _ <<<"$(objects_run "$img" 2 --task instances --save objects,objects_csv,instances)"
    emit "objects: ${n}px, $count discs, instances, 2 ranks / 1" time_ratio "$(ratio "$two_s" "$ins_s")"
    read -r seg_two_s _ <<<"$(objects_run "$img" 2 --task segment --save labels)"
    emit "objects: ${n}px, $count discs, segment labels, 2 ranks / 1" time_ratio "$(ratio "$seg_two_s" "$seg_s")"
    read -r _ few_rss few <<<"$(objects_run "$(discs 82)" 1 --task instances --save objects,objects_csv,instances)"
    read -r _ many_rss lots <<<"$(objects_run "$(discs 26)" 1 --task instances --save objects,objects_csv,instances)"
    emit "objects: ${n}px, $lots vs $few discs, instances" rss_ratio "$(ratio "$many_rss" "$few_rss")"
  done
fi

if want heads; then
  # Models with several heads (issue 56): the bundled three-head model (np 2 classes, hv a 2-channel regression,
  # tp 3 classes) over blobs_4096.tif, the whole process (wall and CPU seconds), the three heads in one job
  # against one head alone (--output_key np, np's settings), once with every head's labels and probabilities
  # (docs/cli.md's example: 2.8x the single head's bytes) and once with labels only (the heads' accumulators
  # without their probability files); and the three heads' job against the three single-head jobs together.
  heads_model="$PWD/samples/models/heads.pt"
  heads_run() {  # heads_run FLAGS... -> "wall_seconds cpu_seconds"
    rm -rf "$cache/out_heads"
    /usr/bin/time -f "%e %U %S" -o "$cache/heads_time" "$bin/tiler" -i "$sample" -m "$heads_model" \
      -o "$cache/out_heads" --no_progress "$@" >/dev/null 2>&1
    awk '{ print $1, $2 + $3 }' "$cache/heads_time"
  }
  three=(--heads np:segment,hv:regress,tp:segment --head_opt np.activation=softmax --head_opt tp.activation=softmax
    --head_opt tp.classes=bg,a,b --head_opt hv.save=probs --head_opt hv.probs_dtype=f16)
  for _ in $(seq "$runs"); do
    read -r one_w one_c <<<"$(heads_run --output_key np --activation softmax --save labels,probs)"
    read -r three_w three_c <<<"$(heads_run "${three[@]}" --save labels,probs)"
    read -r hv_w _ <<<"$(heads_run --output_key hv --save probs --probs_dtype f16)"
    read -r tp_w _ <<<"$(heads_run --output_key tp --activation softmax --classes bg,a,b --save labels,probs)"
    read -r onel_w onel_c <<<"$(heads_run --output_key np --activation softmax --save labels)"
    read -r threel_w threel_c <<<"$(heads_run --heads np,hv,tp --activation softmax --save labels)"
    emit "heads: np alone, labels+probs (process)" seconds "$one_w"
    emit "heads: np,hv,tp in one job, labels+probs (process)" seconds "$three_w"
    emit "heads: three heads / np alone, labels+probs" time_ratio "$(ratio "$three_w" "$one_w")"
    emit "heads: three heads / np alone, labels+probs" cpu_ratio "$(ratio "$three_c" "$one_c")"
    emit "heads: three heads / the three single-head jobs" time_ratio \
      "$(ratio "$three_w" "$(awk -v a="$one_w" -v b="$hv_w" -v c="$tp_w" 'BEGIN { print a + b + c }')")"
    emit "heads: three heads / np alone, labels only" time_ratio "$(ratio "$threel_w" "$onel_w")"
    emit "heads: three heads / np alone, labels only" cpu_ratio "$(ratio "$threel_c" "$onel_c")"
  done
fi

if want codecs; then
  # The output codecs (issue 43): every codec x level, with and without the predictor, over probabilities and
  # labels as tiler writes them: textured (the null model over the textured image: 2 and 5 classes), smooth
  # (the sample UNet over the blobs), and as noisy as they get (the null model over random pixels). File size
  # and MB/s of raw samples one thread compresses.
  n=4096
  [ $quick = 1 ] && n=1024
  img=$(image "$n")
  noise="$cache/noise_$n.tif"
  [ -f "$noise" ] || "$bin/tiler_bench" make "$noise" --size "$n" --noise
  tiny5="$cache/tiny5.pt"
  [ -f "$tiny5" ] || "$bin/tiler_bench" tiny-model "$tiny5" --classes 5
  list="deflate:1,deflate:3,deflate:6,deflate:9,zstd:1,zstd:3,zstd:9,lzw,none"
  [ -n "${CODECS:-}" ] && list=$CODECS
  for spec in "random 2 classes:$tiny:$noise" "textured 2 classes:$tiny:$img" "textured 5 classes:$tiny5:$img" \
    "smooth (UNet):$model:$PWD/samples/images/blobs_4096.tif"; do
    IFS=: read -r name net input <<<"$spec"
    for dtype in f32 f16 u8; do
      out="$cache/out_codecs_$dtype"
      if [ ! -f "$out/done" ] || [ "$(cat "$out/done")" != "$spec" ]; then
        rm -rf "$out"
        "$bin/tiler" -i "$input" -m "$net" -o "$out" --save labels,probs --probs_dtype $dtype --compression none \
          --no_progress >/dev/null 2>&1
        echo "$spec" >"$out/done"
      fi
      files="$(ls "$out"/*_probs.tif)"
      [ $dtype = u8 ] && files="$files $(ls "$out"/*_labels.tif)"
      for f in $files; do
        kind="probs $dtype"
        [[ $f == *_labels.tif ]] && kind=labels
        for _ in $(seq "$runs"); do
          "$bin/tiler_bench" codecs "$f" --codecs "$list" --scratch "$cache/codecs-scratch.tif" |
            while read -r line; do
              codec=$(sed -n 's/.*"codec":"\([^"]*\)".*/\1/p' <<<"$line")
              [[ $line == *'"predictor":false'* ]] && codec="$codec, no predictor"
              emit "codecs: $name, $kind, $codec" ratio "$(json "$line" ratio)"
              emit "codecs: $name, $kind, $codec" mb_per_s "$(json "$line" mb_per_s)"
            done
        done
      done
    done
  done
fi

if want embed; then
  # Per-window encoders (issue 32): tiler --task embed over an 8192 px slide (no overlap) against the pure batched
  # forward of the same encoder, the same windows, in the layout tiler chose (its report's replicas x threads),
  # and against Python's forward on 2 threads (python3-torch, the same LibTorch) when installed. Two encoders:
  # the bundled one (four 3x3 convolutions, 3 of stride 2: ~13 ms a 256 px window on one core) and, when
  # python3-torchvision is installed, torchvision's ResNet-18 exported by scripts/export_model.py
  # (224 px windows, 512 features): models whose forward dominates, as a real encoder's does.
  n=8192
  [ $quick = 1 ] && n=2048
  img=$(image "$n")
  encoders="bundled:$PWD/samples/models/encoder.pt:256"
  if /usr/bin/python3 -c "import torchvision" 2>/dev/null; then
    r18="$cache/resnet18.pt"
    [ -f "$r18" ] || /usr/bin/python3 scripts/export_model.py --encoder torchvision:resnet18 --out "$r18" \
      --window 224 >/dev/null
    encoders="$encoders resnet18:$r18:224"
  fi
  for spec in $encoders; do
    IFS=: read -r name encoder window <<<"$spec"
    for _ in $(seq "$runs"); do
      rm -rf "$cache/out_embed"
      t0=$(now)
      "$bin/tiler" -i "$img" -m "$encoder" -o "$cache/out_embed" --window "$window" --no_progress >/dev/null 2>&1
      wall=$(awk -v a="$t0" -v b="$(now)" 'BEGIN { print b - a }')
      r="$cache/out_embed/report.json"
      job=$(report_field "$r" seconds)
      windows=$(report_field "$r" windows_total)
      out=$("$bin/tiler_bench" forward -m "$encoder" --window "$window" --windows "$windows" --batch_size 8 \
        --replicas "$(report_field "$r" replicas)" --threads "$(report_field "$r" threads)")
      pure=$(json "$out" seconds)
      emit "embed $name: ${n}px, $windows windows, pure forward in tiler's layout" seconds "$pure"
      emit "embed $name: tiler --task embed (job, report)" seconds "$job"
      emit "embed $name: tiler --task embed (process, wall)" seconds "$wall"
      emit "embed $name: tiler job / pure forward" overhead_ratio "$(ratio "$job" "$pure")"
      emit "embed $name: tiler process / pure forward" overhead_ratio "$(ratio "$wall" "$pure")"
      emit "embed $name: tiler --task embed" windows_per_second "$(report_field "$r" windows_per_second)"
      if /usr/bin/python3 -c "import torch" 2>/dev/null; then
        out=$(/usr/bin/python3 scripts/python_forward.py -m "$encoder" --window "$window" --windows "$windows" \
          --threads 2)
        emit "embed $name: pure forward in Python, 2 threads" seconds "$(json "$out" seconds)"
        emit "embed $name: tiler process / Python forward" overhead_ratio "$(ratio "$wall" "$(json "$out" seconds)")"
      fi
    done
  done
fi

# Model runtimes (not part of `all`: needs a tiler that runs .pt2 packages, LibTorch 2.6+, and a Python that
# exports them; run it in the LibTorch 2.6 root that scripts/test-torch2.sh keeps, TILER_BUILD_DIR=build-torch2,
# or on a GPU machine with RUNTIMES_DEVICE=cuda): the same network as TorchScript and as a .pt2 package
# (scripts/export_model.py from the TorchScript's weights, compiled for that device), alternating, with default
# flags (on CUDA at fp32, the precision a package runs in, over two 16384² images; on the CPU over
# blobs_4096.tif): the whole process, and the pure forward of as many windows in tiler's layout (tiler_bench
# forward, the same ModelRunner, either runtime; on CUDA the report's forward_seconds).
if [ "$what" = runtimes ]; then
  "$bin/tiler" --version | grep -q "pt2" || { echo "bench runtimes: this tiler runs no .pt2 packages"; exit 1; }
  device=${RUNTIMES_DEVICE:-cpu}
  runtimes_in=samples/images/blobs_4096.tif device_flags=(--device "$device")
  if [ "$device" = cuda ]; then
    runtimes_in="$cache/runtimes_in"
    mkdir -p "$runtimes_in"
    [ -f "$runtimes_in/img1.tif" ] || "$bin/tiler_bench" make "$runtimes_in/img1.tif" --size 16384 >/dev/null
    [ -f "$runtimes_in/img2.tif" ] || cp "$runtimes_in/img1.tif" "$runtimes_in/img2.tif"
    device_flags+=(--precision fp32)
  fi
  for spec in "unet:UNet:sample.pt:" "encoder:Encoder:encoder.pt:--task embed"; do
    IFS=: read -r name class file flags <<<"$spec"
    script="$PWD/samples/models/$file" package="$cache/${file%.pt}_256_$device.pt2"
    # Exit 3: the package is made but Python's own loader crashed checking it (seen with PyTorch 2.11 on CUDA):
    # tiler's C++ loader runs it below all the same.
    if [ ! -f "$package" ]; then
      rc=0
      PYTHONPATH=samples python3 scripts/export_model.py --module "make_samples:$class" --weights "$script" \
        --out "$package" --window 256 --device "$device" >/dev/null || rc=$?
      [ $rc -eq 0 ] || { [ $rc -eq 3 ] && [ -f "$package" ]; } || exit $rc
    fi
    for _ in $(seq "$runs"); do
      declare -A wall=()
      for runtime in torchscript pt2; do
        m=$script
        [ $runtime = pt2 ] && m=$package
        rm -rf "$cache/out_runtime"
        t0=$(now)
        # shellcheck disable=SC2086 # flags: words
        "$bin/tiler" -i "$runtimes_in" -m "$m" -o "$cache/out_runtime" "${device_flags[@]}" $flags --no_progress \
          >"$cache/out_runtime.log" 2>&1 || { tail -5 "$cache/out_runtime.log"; exit 1; }
        wall[$runtime]=$(awk -v a="$t0" -v b="$(now)" 'BEGIN { print b - a }')
        r="$cache/out_runtime/report.json"
        emit "runtimes $name ($device): tiler whole process, $runtime" seconds "${wall[$runtime]}"
        if [ "$device" = cpu ]; then
          out=$("$bin/tiler_bench" forward -m "$m" --window 256 --windows "$(report_field "$r" windows_total)" \
            --batch_size 8 --replicas "$(report_field "$r" replicas)" --threads "$(report_field "$r" threads)")
          emit "runtimes $name ($device): pure forward in tiler's layout, $runtime" seconds "$(json "$out" seconds)"
        else
          emit "runtimes $name ($device): tiler forward (report), $runtime" seconds "$(sum_field "$r" forward_seconds)"
        fi
      done
      emit "runtimes $name ($device): pt2 / torchscript, whole process" ratio \
        "$(ratio "${wall[pt2]}" "${wall[torchscript]}")"
    done
  done
fi

# The GPU (not part of `all`): the whole process against the pure forward of the same windows in Python on the
# same LibTorch (python3 with torch; torchvision for the FCN), per model, batch, outputs and precision.
# GPU_BENCH_IMAGES (4: start-up weighs as it does over a directory) images of GPU_BENCH_SIZE (16384) px; RUNS as
# elsewhere.
if [ "$what" = gpu ]; then
  py=python3
  size=${GPU_BENCH_SIZE:-16384}
  [ $quick = 1 ] && size=4096
  gpu_in="$cache/gpu_in_$size"
  mkdir -p "$gpu_in"
  for k in $(seq "${GPU_BENCH_IMAGES:-4}"); do
    [ -f "$gpu_in/img$k.tif" ] || { [ $k -gt 1 ] && cp "$gpu_in/img1.tif" "$gpu_in/img$k.tif"; } ||
      "$bin/tiler_bench" make "$gpu_in/img$k.tif" --size "$size" >/dev/null
  done
  fcn="$cache/fcn_resnet50.pt"
  [ -f "$fcn" ] || $py -c "
import torch, torchvision
m = torchvision.models.segmentation.fcn_resnet50(weights=None, weights_backbone=None, num_classes=2, aux_loss=False).eval()
class Out(torch.nn.Module):
    def __init__(self, m): super().__init__(); self.m = m
    def forward(self, x): return self.m(x)['out']
torch.jit.trace(Out(m), torch.rand(1, 3, 512, 512)).save('$fcn')"
  # case NAME MODEL WINDOW BATCH PRECISION SAVE [FLAGS...]
  gpu_case() {
    local name=$1 m=$2 w=$3 b=$4 p=$5 save=$6 t0 wall r windows pyout
    shift 6
    rm -rf "$cache/out_gpu"
    t0=$(now)
    "$bin/tiler" -i "$gpu_in" -m "$m" -o "$cache/out_gpu" --device cuda --precision "$p" --window "$w" \
      --batch_size "$b" --save "$save" --probs_dtype u8 --no_progress "$@" >"$cache/out_gpu.log" 2>&1 ||
      { tail -5 "$cache/out_gpu.log"; return 1; }
    wall=$(awk -v a="$t0" -v b="$(now)" 'BEGIN { print b - a }')
    r="$cache/out_gpu/report.json"
    windows=$(sum_field "$r" windows_total)
    pyout=$($py scripts/python_forward.py -m "$m" --device cuda --precision "$p" --window "$w" --batch_size "$b" \
      --windows "$windows" --threads "$(nproc)")
    emit "gpu $name: tiler whole process" seconds "$wall"
    emit "gpu $name: tiler forward (report)" seconds "$(sum_field "$r" forward_seconds)"
    emit "gpu $name: tiler read (report)" seconds "$(sum_field "$r" read_seconds)"
    emit "gpu $name: tiler write (report)" seconds "$(sum_field "$r" write_seconds)"
    emit "gpu $name: tiler start-up (report)" seconds "$(max_field "$r" startup_seconds)"
    emit "gpu $name: pure forward in Python ($windows windows)" seconds "$(json "$pyout" seconds)"
    emit "gpu $name: whole process / pure forward" overhead_ratio "$(ratio "$wall" "$(json "$pyout" seconds)")"
  }
  for _ in $(seq "$runs"); do
    gpu_case "unet 256px b64 fp16 labels" "$model" 256 64 fp16 labels
    gpu_case "unet 256px b64 fp16 labels, blended on the host" "$model" 256 64 fp16 labels --stitch host
    gpu_case "unet 256px b64 fp16 labels+u8 probs" "$model" 256 64 fp16 labels,probs
    gpu_case "unet 256px b8 fp16 labels" "$model" 256 8 fp16 labels
    gpu_case "unet 256px b64 bf16 labels" "$model" 256 64 bf16 labels
    gpu_case "fcn_resnet50 512px b16 fp16 labels" "$fcn" 512 16 fp16 labels
    gpu_case "fcn_resnet50 512px b16 fp16 labels, blended on the host" "$fcn" 512 16 fp16 labels --stitch host
    gpu_case "fcn_resnet50 512px b16 fp16 labels+u8 probs" "$fcn" 512 16 fp16 labels,probs
  done
fi

"$bin/tiler_bench" summarize -o "$results/bench.json" <"$lines"
echo "wrote $results/bench.json"
