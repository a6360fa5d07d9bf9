#!/usr/bin/env sh
# Exports earlier commits' kernels for a side-by-side GPU run:
#   scripts/gpu_ab_export.sh COMMIT...
# writes .ab/COMMIT/kernels/ and .ab/COMMIT/gpu_attention_bench.py (git-ignored;
# pass ".ab" in the device call's carry), then run benchmarks/gpu_ab.sh there.
set -eu
cd "$(dirname "$0")/.."
for commit in "$@"; do
  dir=.ab/$commit
  rm -rf "$dir"
  mkdir -p "$dir/kernels"
  for path in $(git ls-tree --name-only "$commit" kernels/); do
    git show "$commit:$path" >"$dir/$path"
  done
  git show "$commit:benchmarks/gpu_attention_bench.py" >"$dir/gpu_attention_bench.py"
  echo "$dir"
done
