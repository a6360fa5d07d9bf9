# Run 99 (branch fma): int8 pages' values (and the warpgroup kernel's keys) dequantized a pair of codes in one
# HFMA2, the partial kernel's keys as biased codes. Device calls: carry .whl-b .whl-lm after a call that copied
# .whl-a into /tmp/w (`run.sh tests`), then carry .base (main's engine, kernels, benchmarks and tests:
# `git archive main engine kernels benchmarks tests | tar -x -C .base`).
#   run.sh tests   the int8 GPU tests (fused kernels, the K/V store) -> gpu-test.log
#   run.sh kernel  the kernel bench's KV-dtype arms (run 91's command), main and the branch, A B B A -> kernel-*/
#   run.sh e2e N   issue 26's 32 x 32K cell (run 97's command), the branch -> e2e-N/
set -u
source benchmarks/device_env.sh || exit 1
case $1 in
tests)
  timeout 420 python3 -m pytest -q -x -p no:cacheprovider tests/test_fused_kernels.py tests/test_layer_ops.py \
    -k "int8 or one_fma" > $OUT/gpu-test.log 2>&1
  echo "tests exit $? at $SECONDS s"; tail -3 $OUT/gpu-test.log ;;
kernel)
  mkdir -p /tmp/base-shim/mlxcel && ln -sfn "$PWD/.base/engine" /tmp/base-shim/mlxcel/engine \
    && ln -sfn "$PWD/.base/kernels" /tmp/base-shim/mlxcel/kernels
  branch_path=$PYTHONPATH
  base_path=/tmp/site:/tmp/base-shim:$PWD/.base:$PWD/.base/tests:$PWD/.base/benchmarks
  for arm in main fma fma main; do
    n=$((${n:-0} + 1)); out=$OUT/kernel-$n-$arm; mkdir -p $out
    if [ $arm = main ]; then path=$base_path; bench=.base/benchmarks; else path=$branch_path; bench=benchmarks; fi
    PYTHONPATH=$path MLX_PTX_CACHE_DIR=/tmp/ptx-$arm MLXCEL_KERNELS=fused timeout 110 python3 \
      $bench/gpu_attention_bench.py --out /tmp/att$n --kv-dtypes-only --reps 10 --copy-mib 256 --matmul-n 4096 \
      > $out/att.log 2>&1
    echo "read $n ($arm) exit $? at $SECONDS s"
    cp /tmp/att$n/attention_bench.json /tmp/att$n/attention_bench.md $out/ 2>/dev/null
    grep -E "^\| (bf16|int8|int4)" $out/attention_bench.md
  done ;;
e2e)
  out=$OUT/e2e-$2; mkdir -p $out
  timeout 520 python3 benchmarks/gpu_e2e_bench.py --out /tmp/e2e32-$2 --shared 32768 --kv-dtypes bfloat16,int8 \
    --skip-mlx-lm > $out/e2e.log 2>&1
  echo "e2e $2 exit $? at $SECONDS s"
  cp /tmp/e2e32-$2/e2e_bench.json /tmp/e2e32-$2/e2e_bench.md $out/ 2>/dev/null; grep "^| " $out/e2e_bench.md ;;
esac
