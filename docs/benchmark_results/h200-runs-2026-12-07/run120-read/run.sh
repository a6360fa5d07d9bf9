# Run 120: main (transposed quantized kernels, tiles cut to the fewest filling 3/4 of their waves) read for both
# issues' verdicts, and int8's value scales on the softmax weights (run 119's vscale.patch) tried beside it.
# Device calls: carry .whl-b .whl-lm after a call that copied .whl-a into /tmp/w; each mode one call, on one warm
# machine.
#   run.sh read    the int8 and int4 fused-kernel and quantized-KV GPU tests under NaN poisoning -> tests/, then
#                  issue 26's kernel cell (8192 shared x 32, bf16 / int8 / int4, flat and cascade) -> kernel/
#   run.sh kv      issue 26's end-to-end cell (run 102's `kv` mode: 32 x 32K, bf16 and int8 pages) -> kv/
#   run.sh e2e     issue 18's cell (run 102's `e2e a` mode: 32 x 8K, cascade and flat ABBA, mlx-lm's arm on an
#                  H200) -> e2e-a/
#   run.sh vscale  run 119's `vscale` mode: its vscale.patch (int8's value scales on P) against this code, int8
#                  flat -> vscale/
# Ran on an H100 (no H200 came): `read; vscale` in one call (out-h100/; the tests cut by their timeout after 143
# passed); then, vscale.patch applied on the machine first (`patch -s kernels/cuda.py ...`; committed after), `kv`
# and the GPU tests by dtype: pytest as in `read` with -k int8, then -k int4 (out-h100-vscale/). Not run: e2e.
set -u
source benchmarks/device_env.sh || exit 1
case $1 in
read)
  mkdir -p $OUT/tests $OUT/kernel
  MLXCEL_POISON_OUTPUTS=nan timeout 280 python3 -m pytest -q -x tests/test_fused_kernels.py \
    tests/test_quantized_kv.py -k "int8 or int4" > $OUT/tests/pytest.txt 2>&1
  echo "tests exit $? at $SECONDS s"; tail -3 $OUT/tests/pytest.txt | cut -c1-300
  MLXCEL_KERNELS=fused timeout 150 python3 benchmarks/gpu_attention_bench.py --out /tmp/att --kv-dtypes-only \
    --reps 10 --copy-mib 256 --matmul-n 4096 > $OUT/kernel/att.log 2>&1
  echo "kernel exit $? at $SECONDS s"; cp /tmp/att/attention_bench.json /tmp/att/attention_bench.md $OUT/kernel/
  grep -E "^\| (bf16|int8|int4)" $OUT/kernel/attention_bench.md ;;
kv)
  bash docs/benchmark_results/h200-runs-2026-12-06/run102-h200-read/run.sh kv ;;
e2e)
  bash docs/benchmark_results/h200-runs-2026-12-06/run102-h200-read/run.sh e2e a ;;
vscale)
  bash docs/benchmark_results/h200-runs-2026-12-07/run119-heads-on-n/run.sh vscale ;;
esac
