# Run 102: main as it stands read for both issues' verdicts (`e2e b` also on an H100 after the middle chunks' fix:
# out-h100-fixed/). Device calls: carry .whl-b .whl-lm after a call that copied .whl-a into /tmp/w; each mode
# one call, on one warm machine.
#   run.sh e2e P   issue 18's cell (32 x 8K, cascade and flat ABBA), one process -> e2e-P/; P = a on a card over
#                  100 GB (an H200) runs mlx-lm's arm too (on an H100 its batch does not fit), P = b does not
#   run.sh kernel  issue 26's kernel cell (8192 shared x 32, bf16 / int8 / int4 pages), two reads -> kernel-N/
#   run.sh kv      issue 26's end-to-end cell (32 x 32K, bf16 and int8 pages, cascade and flat ABBA) -> kv/
#   run.sh profile issue 18's step profile (GPU busy, kernels by name, cascade and flat) -> profile/
# Run on the H200 (out/): e2e a, e2e b, kernel (its two reads as two calls); on an H100: profile, kv (out-h100-*/);
# not yet on an H200: kv, profile.
set -u
source benchmarks/device_env.sh || exit 1
case $1 in
e2e)
  mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
  p=$2; flags=--skip-mlx-lm; [ "$mem" -gt 100000 ] && [ $p = a ] && flags=
  out=$OUT/e2e-$p; mkdir -p $out
  timeout 400 python3 benchmarks/gpu_e2e_bench.py --out /tmp/e2e-$p $flags > $out/e2e.log 2>&1
  echo "e2e $p exit $? at $SECONDS s"; cp /tmp/e2e-$p/e2e_bench.json /tmp/e2e-$p/e2e_bench.md $out/ 2>/dev/null
  grep "^| " $out/e2e_bench.md ;;
kernel)
  for n in 1 2; do
    out=$OUT/kernel-$n; mkdir -p $out
    MLXCEL_KERNELS=fused timeout 150 python3 benchmarks/gpu_attention_bench.py --out /tmp/att$n --kv-dtypes-only \
      --reps 10 --copy-mib 256 --matmul-n 4096 > $out/att.log 2>&1
    echo "kernel $n exit $? at $SECONDS s"
    cp /tmp/att$n/attention_bench.json /tmp/att$n/attention_bench.md $out/ 2>/dev/null
    grep -E "^\| (bf16|int8|int4)" $out/attention_bench.md
  done ;;
kv)
  out=$OUT/kv; mkdir -p $out
  timeout 540 python3 benchmarks/gpu_e2e_bench.py --out /tmp/e2e32 --shared 32768 --kv-dtypes bfloat16,int8 \
    --skip-mlx-lm > $out/e2e.log 2>&1
  echo "kv exit $? at $SECONDS s"; cp /tmp/e2e32/e2e_bench.json /tmp/e2e32/e2e_bench.md $out/ 2>/dev/null
  grep "^| " $out/e2e_bench.md ;;
profile)
  out=$OUT/profile; mkdir -p $out
  timeout 400 python3 benchmarks/gpu_step_profile.py --out /tmp/sp > $out/step_profile.log 2>&1
  echo "profile exit $? at $SECONDS s"; cp /tmp/sp/* $out/ 2>/dev/null; head -12 $out/step_profile.md ;;
esac
