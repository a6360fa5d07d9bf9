#!/bin/bash
# Needs git worktrees of f2fa168 at /tmp/old and 4de2910 at /tmp/cur, each with a shim folder whose mlxcel/
# links to its engine/ and kernels/ (/tmp/oldshim, /tmp/cur/shim), and the paths of this machine (model, OpenBLAS).
# usage: hostread2.sh OUT reads  (old, main, tree with MLXCEL_TRACED_LAYERS=$TRACED)
cd "$(git rev-parse --show-toplevel)"
M=/root/.cache/mlxcel/models/tiny-qwen3-v2
H=docs/benchmark_results/cpu-host-2026-12-03/host_idle.py
for i in $(seq $2); do for c in on off; do
  echo "# old $c"; PYTHONPATH=/tmp/oldshim:/tmp/old .venv/bin/python $H old $c $M 2>/dev/null
  echo "# main $c"; PYTHONPATH=/tmp/cur/shim:/tmp/cur .venv/bin/python $H new $c $M 2>/dev/null
  echo "# tree $c traced=$TRACED"; MLXCEL_TRACED_LAYERS=$TRACED .venv/bin/python $H new $c $M 2>/dev/null
done; done >> $1
