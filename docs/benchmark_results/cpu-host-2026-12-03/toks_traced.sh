#!/bin/bash
# tok/s, host and token digest of the tree untraced (MLXCEL_TRACED_LAYERS=off) against MLXCEL_TRACED_LAYERS=on, reference
# BLAS and OpenBLAS (the CLI's environment), cascade on and off; the paths of this machine (model, OpenBLAS).
# usage: toks_traced.sh OUT reads (at ac74c9e the default was traced; since, MLXCEL_TRACED_LAYERS=on is)
cd "$(git rev-parse --show-toplevel)"
M=/root/.cache/mlxcel/models/tiny-qwen3-v2
T=docs/benchmark_results/cpu-host-2026-12-03/traced_wall.py
for i in $(seq $2); do for blas in reference openblas; do for c in on off; do
  if [ $blas = openblas ]; then
    export LD_LIBRARY_PATH=/root/.cache/mlxcel/openblas/1ff42668ef2094b6 LD_PRELOAD=/work/main/.venv/lib/python3.11/site-packages/cmeel.prefix/lib/libopenblas.so.0 OPENBLAS_NUM_THREADS=1 MALLOC_MMAP_THRESHOLD_=1073741824 MALLOC_TRIM_THRESHOLD_=2147483648
  else
    unset LD_LIBRARY_PATH LD_PRELOAD OPENBLAS_NUM_THREADS MALLOC_MMAP_THRESHOLD_ MALLOC_TRIM_THRESHOLD_
  fi
  echo "# untraced $blas $c"; MLXCEL_TRACED_LAYERS=off .venv/bin/python $T $c $M 2>/dev/null
  echo "# traced $blas $c"; MLXCEL_TRACED_LAYERS=on .venv/bin/python $T $c $M 2>/dev/null
done; done; done >> $1
