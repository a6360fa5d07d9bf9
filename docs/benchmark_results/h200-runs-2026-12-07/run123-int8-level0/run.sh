# Run 123 (read on an H100 the next session: out-h100/; rows is main since; variants.py edits main as of
# 9240ccb): int8's stacked level against bf16's at 32768 and 8192
# shared x 32 (run 121: an H200's cascade int8 step 5-10% longer than bf16's at 32K, an H100's at parity), and changes
# to int8's level (variants.py): a ring of 4 chunks, three operand pairs (the producers convert up to two chunks
# ahead, not one), conflict-free float16 stores in the conversion, the producers' refill after their fence
# (probe.py says each).
# Device calls: carry .whl-b .whl-lm after a call that copied .whl-a into /tmp/w; one warm machine.
#   run.sh probe     probe.py: the cascade step and level 0 alone, every arm side by side -> probe/
#   run.sh ncu       Nsight Compute over the level-0 launches at 32K (bf16 and the int8 arms but the last;
#                    caches flushed, as the engine's layers find them): details, SASS with samples -> ncu/
#   run.sh profile   run 122's step profile (32 x 32K, bf16 and int8 pages) -> profile/
#   run.sh e2e V     the end-to-end cell at 32 x 32K, bf16 and int8 pages (run 102's `kv`), with variant V's level-0
#                    kernel (variants.py; V with pairs3: three operand pairs in fused's staging bytes too) -> e2e-V/
#   run.sh tests V   the int8 fused-kernel and quantized-KV GPU tests under NaN poisoning, with V's kernel -> tests-V/
#   run.sh first     probe, then the int8 arm of a module fastest at 32768 x 32, if 2% or more faster than main,
#                    into /tmp/best (the machine's idle release leaves no time to read the probe between calls)
#   run.sh best      tests and e2e with /tmp/best's module (none: the ncu mode)
set -u
source benchmarks/device_env.sh || exit 1
D=docs/benchmark_results/h200-runs-2026-12-07/run123-int8-level0
apply() {    # variant $1's level-0 kernel in place of main's (pairs3: three operand pairs in fused's bytes too)
  cp kernels/cuda_warpgroup.py /tmp/cuda_warpgroup.py; cp kernels/fused.py /tmp/fused.py
  python3 $D/variants.py $1 > /tmp/variant.py && cp /tmp/variant.py kernels/cuda_warpgroup.py
  case $1 in *pairs3*) sed -i 's/pairs = 2 if has_producer/pairs = 3 if has_producer/' kernels/fused.py ;; esac
}
restore() { cp /tmp/cuda_warpgroup.py kernels/cuda_warpgroup.py; cp /tmp/fused.py kernels/fused.py; }
case $1 in
probe)
  mkdir -p $OUT/probe
  MLXCEL_KERNELS=fused timeout 300 python3 $D/probe.py /tmp/probe > $OUT/probe/probe.log 2>&1
  echo "probe exit $? at $SECONDS s"; cp /tmp/probe/* $OUT/probe/ 2>/dev/null; cat $OUT/probe/probe.md
  grep "==" $OUT/probe/probe.log | cut -c1-400; tail -2 $OUT/probe/probe.log | cut -c1-400 ;;
ncu)
  mkdir -p $OUT/ncu
  MLXCEL_KERNELS=fused timeout 400 ncu --set full --section SourceCounters -k regex:warpgroup -c 8 -o /tmp/level0 -f \
    python3 $D/probe.py /tmp/ncu --once 32768x32 > $OUT/ncu/ncu.log 2>&1
  echo "ncu exit $? at $SECONDS s"; tail -3 $OUT/ncu/ncu.log | cut -c1-300
  ncu -i /tmp/level0.ncu-rep --print-details all > $OUT/ncu/details.txt 2>&1
  ncu -i /tmp/level0.ncu-rep --page source --print-source sass --csv > $OUT/ncu/sass.csv 2> $OUT/ncu/import.log
  grep -E "warpgroup|Duration|DRAM Through|Registers Per|Achieved Occ|Issued Warp|Shared Memory Conf|L1/TEX Hit" \
    $OUT/ncu/details.txt | head -60
  gzip -f $OUT/ncu/details.txt $OUT/ncu/sass.csv ;;
e2e)
  out=$OUT/e2e-$2; mkdir -p $out; apply $2
  timeout 400 python3 benchmarks/gpu_e2e_bench.py --out /tmp/e2e-$2 --shared 32768 --kv-dtypes bfloat16,int8 \
    --skip-mlx-lm > $out/e2e.log 2>&1
  echo "e2e $2 exit $? at $SECONDS s"; cp /tmp/e2e-$2/e2e_bench.json /tmp/e2e-$2/e2e_bench.md $out/ 2>/dev/null
  restore; grep "^| " $out/e2e_bench.md ;;
tests)
  out=$OUT/tests-$2; mkdir -p $out; apply $2
  MLXCEL_KERNELS=fused MLXCEL_POISON_OUTPUTS=nan timeout 300 python3 -m pytest -q tests/test_fused_kernels.py \
    tests/test_quantized_kv.py -k "int8" > $out/pytest.txt 2>&1
  echo "tests $2 exit $? at $SECONDS s"; restore; tail -3 $out/pytest.txt | cut -c1-300 ;;
first)
  bash $D/run.sh probe
  python3 - $OUT/probe/probe.json > /tmp/best <<'PY'
import json, sys
timed = json.load(open(sys.argv[1]))["32768x32"]["timed"]
main = timed["int8 cascade, main"]["s"]
arms = {"pairs3": "pairs3", "rows": "rows", "rows pairs3": "rows_pairs3", "late": "late",
           "late rows pairs3": "late_rows_pairs3", "late1": "late1"}
s, name = min((timed[f"int8 cascade, {arm}"]["s"], arm) for arm in arms)
print(arms[name] if s < 0.98 * main else "", end="")
PY
  echo "best: '$(cat /tmp/best)'" ;;
best)
  b=$(cat /tmp/best); [ -n "$b" ] || { echo "no arm 2% faster than main: ncu instead"; bash $D/run.sh ncu; exit 0; }
  bash $D/run.sh tests $b; bash $D/run.sh e2e $b ;;
profile)
  bash docs/benchmark_results/h200-runs-2026-12-07/run122-h200-int8-32k/run.sh profile ;;
esac
