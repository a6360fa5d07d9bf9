#!/usr/bin/env bash
# The GPU run of the fused kernels, in one script: install MLX from carried
# wheels, run the correctness tests on the GPU, then the benchmarks; results
# (logs, junit xml, json, markdown tables) go to OUTDIR.
#
#   benchmarks/gpu_suite.sh OUTDIR [WHEEL_DIR ...]
#
# WHEEL_DIRs hold MLX's CUDA wheels as ../shared/tools/mlx-cuda-wheels
# prepares them (.whl-a: mlx + part.aa, .whl-b: part.ab) and optionally
# mlx-lm's wheel (.whl-lm); their files are gathered in /tmp/w, the split
# wheel is put back together and everything installs into /tmp/site. A
# machine where /tmp/site already imports mlx skips the install, so a first
# call can copy one half and a second call bring the other and run the rest.
#
# Steps (each logged; a failing step is recorded and the next still runs,
# except the smoke step: a few kernel tests that stop the run when they fail):
#   1. MLXCEL_KERNELS=fused, outputs poisoned with NaN: the fused-kernel tests
#      and the kernel and decode-path suites (tests/test_fused_kernels.py,
#      test_kernels.py, test_attention.py, test_cascade_planner.py, test_cuda_matmul.py).
#   2. The same suites on the portable kernels on the GPU (MLXCEL_KERNELS=portable).
#   3. benchmarks/gpu_attention_bench.py (with the level-0 tile-width sweep),
#      then benchmarks/gpu_timeline.py (the GPU's own kernel timestamps at the
#      headline cell) and benchmarks/gpu_matmul_bench.py (the skinny matmul
#      against cuBLAS) where torch is importable, and
#      benchmarks/gpu_flashinfer_bench.py where .fi-bundle/ was carried, and
#      benchmarks/gpu_forest_bench.py (nested and two-tenant cells).
#   4. benchmarks/gpu_e2e_bench.py (the cascade arms with the skinny matmul and
#      with cuBLAS) and benchmarks/gpu_step_profile.py when
#      GPU_SUITE_E2E=1 (needs mlx-lm's wheel); GPU_SUITE_E2E=only runs these alone.
# Runs well under 10 minutes without step 4; step 4 adds about 3.
set -uo pipefail
out=${1:?usage: gpu_suite.sh OUTDIR [WHEEL_DIR ...]}
shift
root=$(cd "$(dirname "$0")/.." && pwd)
site=/tmp/site
mkdir -p "$out"
status=0
step() {  # step NAME COMMAND...: run, log to OUTDIR/NAME.log, remember failures
  local name=$1
  shift
  echo "== $name: $*"
  local begin=$SECONDS
  "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "== $name: exit $rc in $((SECONDS - begin)) s" | tee -a "$out/summary.txt"
  tail -n 25 "$out/$name.log"
  [ $rc -eq 0 ] || status=1
}

if ! PYTHONPATH=$site python3 -c "import mlx.core" 2>/dev/null; then
  mkdir -p /tmp/w
  for d in "$@"; do cp "$d"/* /tmp/w/; done
  if ! ls /tmp/w/part.ab >/dev/null 2>&1; then
    echo "wheels copied to /tmp/w; the other half is still missing"
    exit 0
  fi
  cat /tmp/w/part.* >/tmp/w/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl && rm /tmp/w/part.*
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" /tmp/w/*.whl || exit 1
fi
# A machine that kept MLX from an earlier call may still lack mlx-lm.
if [ "${GPU_SUITE_E2E:-0}" != 0 ] && ! PYTHONPATH=$site python3 -c "import mlx_lm" 2>/dev/null; then
  for d in "$@"; do
    for w in "$d"/mlx_lm-*.whl; do
      [ -e "$w" ] && python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$w"
    done
  done
fi

# mlxcel.engine and mlxcel.kernels are engine/ and kernels/ (setuptools
# package-dir); without installing the project, a namespace folder maps them.
shim=/tmp/mlxcel-shim
mkdir -p "$shim/mlxcel"
ln -sfn "$root/engine" "$shim/mlxcel/engine"
ln -sfn "$root/kernels" "$shim/mlxcel/kernels"
export PYTHONPATH=$site:$shim:$root:$root/tests
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
cd "$root"

{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total,temperature.gpu --format=csv
  python3 -c "import mlx.core as mx; print('mlx', mx.__version__, mx.default_device(), 'cuda', mx.cuda.is_available())"
} 2>&1 | tee "$out/device.txt"

if [ "${GPU_SUITE_E2E:-0}" != only ]; then
  # A few kernels first: a kernel that fails to compile or to compute would
  # otherwise fail (and recompile) in every test of the suites.
  step smoke env MLXCEL_POISON_OUTPUTS=nan python3 -m pytest -q -x -p no:cacheprovider \
    tests/test_fused_kernels.py::test_merge_matches_reference tests/test_fused_kernels.py::test_stacked_heads_of_a_cascade_level_0
  if [ $status -ne 0 ]; then
    cat "$out/summary.txt"
    exit 1
  fi
  suites="tests/test_fused_kernels.py tests/test_kernels.py tests/test_attention.py tests/test_cascade_planner.py
    tests/test_cuda_matmul.py tests/test_cost_model.py
    tests/test_engine.py tests/test_pipeline.py tests/test_cascade_fault.py"
  # The skinny matmul's nvcc compile tests need no GPU (CI runs them) and take minutes of device time here.
  step tests_fused env MLXCEL_KERNELS=fused MLXCEL_POISON_OUTPUTS=nan \
    python3 -m pytest -q -p no:cacheprovider -rs --maxfail=40 --junitxml="$out/tests_fused.xml" $suites \
    --deselect tests/test_cuda_matmul.py::test_the_kernel_compiles_without_spills_in_its_shared_memory
  step tests_portable env MLXCEL_KERNELS=portable \
    python3 -m pytest -q -p no:cacheprovider -rs tests/test_kernels.py tests/test_attention.py
  step attention_bench python3 benchmarks/gpu_attention_bench.py --out "$out" --sweep
  # The GPU's own timestamps of the headline cell (CUPTI through PyTorch's
  # profiler), where PyTorch is installed.
  if python3 -c "import torch" 2>/dev/null; then
    step timeline python3 benchmarks/gpu_timeline.py --out "$out"
    step matmul_bench python3 benchmarks/gpu_matmul_bench.py --out "$out"
  fi
  # FlashInfer's cascade beside ours where its bundle was carried
  # (scripts/flashinfer_bundle.sh builds .fi-bundle/; its JIT uses this nvcc).
  if [ -f "$root/.fi-bundle/install.sh" ]; then
    step flashinfer_install bash "$root/.fi-bundle/install.sh" /tmp/fisite
    step flashinfer_bench env PYTHONPATH="/tmp/fisite:$PYTHONPATH" CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}" \
      python3 benchmarks/gpu_flashinfer_bench.py --out "$out"
  fi
  # Several subgroups and nested spans (FlashInfer's multi-level wrapper beside them where installed above).
  step forest_bench env PYTHONPATH="/tmp/fisite:$PYTHONPATH" CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}" \
    python3 benchmarks/gpu_forest_bench.py --out "$out"
fi
if [ "${GPU_SUITE_E2E:-0}" != 0 ]; then
  step e2e_bench python3 benchmarks/gpu_e2e_bench.py --out "$out" --cascade-matmuls auto,cublas
  step step_profile python3 benchmarks/gpu_step_profile.py --out "$out"
fi
cat "$out/summary.txt"
exit $status
