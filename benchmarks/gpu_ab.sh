#!/usr/bin/env bash
# Side by side on the GPU: this tree's kernels against earlier commits'
# kernels (exported here by scripts/gpu_ab_export.sh into .ab/), in one call
# on one machine, the arms interleaved for ROUNDS rounds (default 2), so the
# ratios between builds are measured together rather than across machines.
#
#   benchmarks/gpu_ab.sh OUTDIR [gpu_attention_bench.py arguments...]
#
# MLX must already be installed in /tmp/site (benchmarks/gpu_suite.sh does
# that). Every arm runs its own commit's gpu_attention_bench.py over this
# tree's engine: an arm whose kernels need a different engine API fails (its
# log says so) and the others still run. Output: OUTDIR/ARM-ROUND/ (the
# benchmark's json and tables) and OUTDIR/ARM-ROUND.log; the tables are echoed.
# The logs hold every cell's JSON line as well: enough when the device machine
# returns only some of OUTDIR's files (it caps how many come back).
set -uo pipefail
out=${1:?usage: gpu_ab.sh OUTDIR [benchmark arguments...]}
shift
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1

shim() {  # shim NAME KERNELS_DIR: a package folder mapping mlxcel.{engine,kernels}
  local dir=/tmp/mlxcel-ab/$1
  mkdir -p "$dir/mlxcel"
  ln -sfn "$root/engine" "$dir/mlxcel/engine"
  ln -sfn "$2" "$dir/mlxcel/kernels"
  echo "$dir"
}

arms=("tree:$(shim tree "$root/kernels"):$root/benchmarks/gpu_attention_bench.py")
for ref in "$root"/.ab/*/; do
  [ -d "$ref/kernels" ] || continue
  name=$(basename "$ref")
  arms+=("$name:$(shim "$name" "$ref/kernels"):$ref/gpu_attention_bench.py")
done

for round in $(seq "${ROUNDS:-2}"); do
  for arm in "${arms[@]}"; do
    IFS=: read -r name package bench <<<"$arm"
    PYTHONPATH=/tmp/site:$package:$root:$root/tests:$root/benchmarks \
      python3 "$bench" --out "$out/$name-$round" "$@" >"$out/$name-$round.log" 2>&1
    echo "== $name, round $round: exit $?"
    grep -A40 '^| S | B' "$out/$name-$round.log" | grep '^|' | head -14
  done
done
