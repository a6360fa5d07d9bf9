# Run 97: main (gate/up on TMA since run 89's reads) re-read at issue 26's end-to-end cell: 32 x 32K, bf16 and
# int8 pages, cascade and flat, ABBA in one process. `run.sh N`: read N, one a device call, on one warm machine.
# Device calls: carry .whl-b .whl-lm after a call that copied .whl-a into /tmp/w. Output: e2e-N/.
set -u
source benchmarks/device_env.sh || exit 1
out=$OUT/e2e-$1; mkdir -p $out
timeout 520 python3 benchmarks/gpu_e2e_bench.py --out /tmp/e2e32-$1 --shared 32768 --kv-dtypes bfloat16,int8 \
  --skip-mlx-lm > $out/e2e.log 2>&1
echo "e2e $1 exit $? at $SECONDS s"
cp /tmp/e2e32-$1/e2e_bench.json /tmp/e2e32-$1/e2e_bench.md $out/ 2>/dev/null; grep "^| " $out/e2e_bench.md
