#!/bin/bash
# Needs a git worktree of f2fa168 at /tmp/old with a shim folder /tmp/oldshim whose mlxcel/ links to its engine/ and
# kernels/, and the paths of this machine (models, the OpenBLAS link folder under ~/.cache/mlxcel/openblas/).
# usage: traced_ab.sh OUT READS: old/main/traced host time (reference BLAS, as host_idle's verdict), then user tok/s
# (OpenBLAS, the CLI's environment): tiny model traced_wall on/off, SmolLM2 8 sessions; traced vs untraced.
cd "$(git rev-parse --show-toplevel)"
M=/root/.cache/mlxcel/models/tiny-qwen3-v2
S=/root/.cache/mlxcel/models/smollm2-135m-instruct-v1-float32
H=docs/benchmark_results/cpu-host-2026-12-03/host_idle.py
T=docs/benchmark_results/cpu-host-2026-12-03/traced_wall.py
D=docs/benchmark_results/cpu-host-2026-12-03/smollm2_decode.py
L=$PWD/.venv/lib/python3.11/site-packages/cmeel.prefix/lib/libopenblas.so.0
OB="LD_LIBRARY_PATH=/root/.cache/mlxcel/openblas/4f547d29994f2402 LD_PRELOAD=$L OPENBLAS_NUM_THREADS=1
  MALLOC_MMAP_THRESHOLD_=1073741824 MALLOC_TRIM_THRESHOLD_=2147483648"
for i in $(seq $2); do
  for c in on off; do
    echo "# host old $c"; PYTHONPATH=/tmp/oldshim:/tmp/old .venv/bin/python $H old $c $M 2>/dev/null
    echo "# host untraced $c"; MLXCEL_TRACED_LAYERS=off .venv/bin/python $H new $c $M 2>/dev/null
    echo "# host traced $c"; MLXCEL_TRACED_LAYERS=on .venv/bin/python $H new $c $M 2>/dev/null
  done
  for c in on off; do
    echo "# tiny untraced $c"; env $OB MLXCEL_TRACED_LAYERS=off .venv/bin/python $T $c $M 2>/dev/null
    echo "# tiny traced $c"; env $OB MLXCEL_TRACED_LAYERS=on .venv/bin/python $T $c $M 2>/dev/null
  done
  echo "# smol untraced 8"; env $OB MLXCEL_TRACED_LAYERS=off .venv/bin/python $D $S 8 2>/dev/null
  echo "# smol traced 8"; env $OB MLXCEL_TRACED_LAYERS=on .venv/bin/python $D $S 8 2>/dev/null
done >> $1
