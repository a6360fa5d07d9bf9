# Decode-step issue, second H200 run: MLX's CUDA graph sizes (MLX_MAX_OPS_PER_BUFFER / MLX_MAX_MB_PER_BUFFER),
# each variant a step profile of its own process; then the end-to-end bench (ABBA engine reads, mlx-lm,
# teacher-forced) with the variant whose cascade arm was fastest.
# Device call: carry .whl-b .whl-lm after a call that copied .whl-a into /tmp/w.
set -u
cp .whl-b/* /tmp/w/ && cat /tmp/w/part.* > /tmp/w/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl && rm /tmp/w/part.*
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/w/*.whl .whl-lm/*.whl || exit 1
mkdir -p /tmp/mlxcel-shim/mlxcel && ln -sfn $PWD/engine /tmp/mlxcel-shim/mlxcel/engine && ln -sfn $PWD/kernels /tmp/mlxcel-shim/mlxcel/kernels
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
MLXCEL_KERNELS=fused MLXCEL_POISON_OUTPUTS=nan timeout 120 python3 -m pytest -q -x -p no:cacheprovider \
  tests/test_engine.py tests/test_cascade_fault.py tests/test_attention.py > $OUT/tests.log 2>&1
echo "tests exit $? at $SECONDS s"; tail -2 $OUT/tests.log
variant() {  # variant NAME OPS MB
  MLX_MAX_OPS_PER_BUFFER=$2 MLX_MAX_MB_PER_BUFFER=$3 timeout 100 \
    python3 benchmarks/gpu_step_profile.py --out /tmp/p-$1 > /tmp/p-$1.log 2>&1
  echo "== $1 (ops $2, MB $3): exit $? at $SECONDS s" | tee -a $OUT/variants.md
  grep "^| \(cascade\|flat\)" /tmp/p-$1/step_profile.md | tee -a $OUT/variants.md
  cp /tmp/p-$1/step_profile.json $OUT/profile-$1.json 2>/dev/null
}
variant a-default 100 1000
variant b-200 200 1000000
variant c-400 400 1000000
variant d-1000 1000 1000000
best=$(python3 - <<'PY'
import json, os
runs = {}
for name in ("a-default", "b-200", "c-400", "d-1000"):
    try:
        runs[name] = json.load(open(f"{os.environ['OUT']}/profile-{name}.json"))["arms"]["cascade"]["tokens_per_s"]
    except Exception:
        pass
print(max(runs, key=runs.get))
PY
)
echo "best: $best" | tee -a $OUT/variants.md
case $best in a-*) O=100 M=1000;; b-*) O=200 M=1000000;; c-*) O=400 M=1000000;; *) O=1000 M=1000000;; esac
cp /tmp/p-$best/step_profile.md $OUT/best_profile.md
MLX_MAX_OPS_PER_BUFFER=$O MLX_MAX_MB_PER_BUFFER=$M timeout $((575 - SECONDS)) \
  python3 benchmarks/gpu_e2e_bench.py --out /tmp/e2e > $OUT/e2e.log 2>&1
echo "e2e exit $? at $SECONDS s"; cp /tmp/e2e/e2e_bench.json /tmp/e2e/e2e_bench.md $OUT/ 2>/dev/null
grep "^| " $OUT/e2e_bench.md; grep -o '"reads_agree[^}]*}' $OUT/e2e_bench.json
