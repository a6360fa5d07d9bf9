#!/bin/bash
# Needs a git worktree of f2fa168 at /tmp/old with a shim folder /tmp/oldshim whose mlxcel/ links to its engine/ and
# kernels/, and the paths of this machine (models, the OpenBLAS link folder under ~/.cache/mlxcel/openblas/).
# usage: traced_ab.sh OUT READS: old / main (traced, the default) / main untraced (MLXCEL_TRACED_LAYERS=off) host
# time, READS interleaved reads (reference BLAS, as host_idle's verdict); then what a user gets, traced against
# untraced in one process (traced_inprocess.py, OpenBLAS, the CLI's environment): the tiny model at 8 sessions
# cascade on and off, SmolLM2 at 8 sessions and at one, each in both orders.
cd "$(git rev-parse --show-toplevel)"
M=/root/.cache/mlxcel/models/tiny-qwen3-v2
S=/root/.cache/mlxcel/models/smollm2-135m-instruct-v1-float32
H=docs/benchmark_results/cpu-host-2026-12-03/host_idle.py
T=docs/benchmark_results/cpu-host-2026-12-03/traced_inprocess.py
L=$PWD/.venv/lib/python3.11/site-packages/cmeel.prefix/lib/libopenblas.so.0
OB="LD_LIBRARY_PATH=/root/.cache/mlxcel/openblas/4f547d29994f2402 LD_PRELOAD=$L OPENBLAS_NUM_THREADS=1
  MALLOC_MMAP_THRESHOLD_=1073741824 MALLOC_TRIM_THRESHOLD_=2147483648"
echo "# main at $(git rev-parse --short HEAD)" >> $1
for i in $(seq $2); do
  for c in on off; do
    echo "# host old $c"; PYTHONPATH=/tmp/oldshim:/tmp/old .venv/bin/python $H old $c $M 2>/dev/null
    echo "# host main $c"; .venv/bin/python $H new $c $M 2>/dev/null
    echo "# host untraced $c"; MLXCEL_TRACED_LAYERS=off .venv/bin/python $H new $c $M 2>/dev/null
  done
done >> $1
for cell in "$M 8 on" "$M 8 off" "$S 8 on" "$S 1 on"; do
  set -- $1 $cell
  for order in "on off" "off on"; do
    echo "## $(basename $2), $3 sessions, cascade $4, traced modes in order: $order"
    AB_MODEL=$2 AB_N=$3 env $OB .venv/bin/python $T $4 $order 2>/dev/null
  done
done >> $1
