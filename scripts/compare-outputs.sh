#!/usr/bin/env bash
# Runs every task and every --save kind over the bundled samples with two tiler executables and compares the
# outputs byte for byte (report.json aside: it holds timings). For a change that should change no output
# (a refactor): build the old commit's tiler somewhere, then
#   scripts/compare-outputs.sh OLD_TILER NEW_TILER [WORK_DIR]
# Exit 0 when every output is identical, 1 naming each that differs or exists on one side only.
set -euo pipefail
old="$(realpath "$1")"
new="$(realpath "$2")"
work="${3:-$(mktemp -d)}"
samples="$(cd "$(dirname "$0")/../samples" && pwd)"
m="$samples/models"
jobs=(
  "segment|-i $samples/images --save labels,probs,polygons,zarr --pyramid --classes bg,blob:#e6194b"
  "segment_png_u8|-i $samples/images/small.png --format png --save labels,probs --probs_dtype u8"
  "heads|-i $samples/images/blobs_4096.tif -m $m/heads.pt --heads np:segment,hv:regress,tp:segment --save labels,probs --head_opt hv.save=probs,zarr --head_opt hv.probs_dtype=f16"
  "classify|-i $samples/images -m $m/classifier.pt --task classify --activation softmax --save csv,tiles,heatmap"
  "embed|-i $samples/images -m $m/encoder.pt --task embed --save features,features_pt"
  "detect|-i $samples/images -m $m/detector.pt --task detect --save objects,objects_csv,coco"
  "instances|-i $samples/images -m $m/instances.pt --task instances --save objects,objects_csv,instances"
)
status=0
for job in "${jobs[@]}"; do
  name="${job%%|*}"
  flags="${job#*|}"
  for side in old new; do
    bin="$old"
    [ "$side" = new ] && bin="$new"
    rm -rf "${work:?}/$side/$name"
    mkdir -p "$work/$side"
    code=0
    # shellcheck disable=SC2086
    "$bin" $flags -o "$work/$side/$name" --no_progress >"$work/$side-$name.log" 2>&1 || code=$?
    if [ $code -ne 0 ]; then
      echo "$name: the $side tiler failed (exit $code): $work/$side-$name.log"
      status=1
    fi
  done
  listing() { (cd "$1" && find . -type f ! -name report.json | sort); }
  if ! diff <(listing "$work/old/$name") <(listing "$work/new/$name") >/dev/null; then
    echo "$name: the outputs' names differ:"
    diff <(listing "$work/old/$name") <(listing "$work/new/$name") || true
    status=1
  fi
  while read -r file; do
    if [ -f "$work/new/$name/$file" ] && ! cmp -s "$work/old/$name/$file" "$work/new/$name/$file"; then
      echo "$name: $file differs"
      status=1
    fi
  done < <(listing "$work/old/$name")
  echo "$name: $(listing "$work/old/$name" | wc -l) file(s) compared"
done
[ $status -eq 0 ] && echo "every output identical ($work)"
exit $status
