# Run 121: main as it stands read for both issues' verdicts, made for an H200 (none has come since run 102). Device
# calls: carry .whl-b .whl-lm after a call that copied .whl-a into /tmp/w; each mode one call, on one warm machine,
# in this order (the most needed first: a session's 30 device minutes hold the install and about four modes).
# Ran on an H100 (out-h100/): read, kbias, int4 and kv (one call), ncu. Then an H200 came (out-h200/) with 7.5
# device minutes left: run 102's kernel and kv modes in one call (kv/e2e_bench.md rebuilt from its JSON here by
# gpu_e2e_bench.markdown: the call's file count left it behind).
#   run.sh read    the int8 fused-kernel and quantized-KV GPU tests under NaN poisoning (the value scales' lift by
#                  64 not yet run on a GPU; on an H100 ~190 s) -> tests-int8/; then run 102's `kernel` mode (issue
#                  26's kernel cell, 8192 shared x 32, bf16 / int8 / int4, flat and cascade, two reads) -> kernel-N/
#   run.sh kbias   kbias.patch (made here, compiled with nvcc: int8's transposed kernel with its key codes biased
#                  by 1152, no HSUB2 a code pair, each head's 1152 x sum of q taken off its scores' chains; its
#                  loop 585 -> 529 instructions, 96 registers: still five blocks an SM) against this code, int8
#                  flat partial launch side by side (run 118's variants.py) -> kbias/; then, the patch applied,
#                  the int8 GPU tests -> kbias-tests/
#   run.sh kv      issue 26's end-to-end cell (run 102's `kv` mode: 32 x 32K, bf16 and int8 pages; ~300 s) -> kv/
#   run.sh int4    the int4 GPU tests (the same SASS as run 120's tested code; ~125 s on an H100) -> tests-int4/
#   run.sh ncu     Nsight Compute's full set over a cascade step's level 0 and merging private level, 8192 shared
#                  x 32, tail 96 (run 41's script) -> ncu/ (details gzipped here)
#   run.sh e2e     issue 18's cell (run 102's `e2e a` mode: 32 x 8K, cascade and flat ABBA, mlx-lm's arm on an
#                  H200) -> e2e-a/
set -u
source benchmarks/device_env.sh || exit 1
case $1 in
read|int4)
  dtype=int8; [ $1 = int4 ] && dtype=int4
  mkdir -p $OUT/tests-$dtype
  MLXCEL_POISON_OUTPUTS=nan timeout 280 python3 -m pytest -q -x tests/test_fused_kernels.py \
    tests/test_quantized_kv.py -k $dtype > $OUT/tests-$dtype/pytest.txt 2>&1
  echo "tests $dtype exit $? at $SECONDS s"; tail -1 $OUT/tests-$dtype/pytest.txt | cut -c1-300
  [ $1 = read ] && bash docs/benchmark_results/h200-runs-2026-12-06/run102-h200-read/run.sh kernel ;;
kv)
  bash docs/benchmark_results/h200-runs-2026-12-06/run102-h200-read/run.sh kv ;;
ncu)
  R=docs/benchmark_results/h200-runs-2026-12-02/run41-profile; export PYTHONPATH=$PYTHONPATH:$PWD/$R; mkdir -p $OUT/ncu
  timeout 300 ncu --set full -k regex:"warpgroup_partial|merged_partial" -c 2 -o /tmp/cascade python3 \
    $R/ncu_cascade.py > $OUT/ncu/ncu.log 2>&1
  echo "ncu exit $?"; ncu -i /tmp/cascade.ncu-rep --print-details all > $OUT/ncu/ncu_details.txt 2>&1
  grep -E "partial_|Duration|DRAM Through|Registers Per|Achieved Occ|Issued Warp" $OUT/ncu/ncu_details.txt \
    | head -40 ;;
e2e)
  bash docs/benchmark_results/h200-runs-2026-12-06/run102-h200-read/run.sh e2e a ;;
kbias)
  D=docs/benchmark_results/h200-runs-2026-12-07/run121-h200-read
  mkdir -p $OUT/kbias $OUT/kbias-tests; cp kernels/cuda.py kernels/cuda_main.py
  patch -s -o kernels/cuda_kbias.py kernels/cuda.py $D/kbias.patch || exit 1
  MLXCEL_KERNELS=fused timeout 200 python3 docs/benchmark_results/h200-runs-2026-12-07/run118-conversions/variants.py \
    /tmp/kbias kbias=cuda_kbias > $OUT/kbias/variants.log 2>&1
  echo "kbias exit $? at $SECONDS s"; cp /tmp/kbias/* $OUT/kbias/ 2>/dev/null; cat $OUT/kbias/variants.md
  grep "difference" $OUT/kbias/variants.log; mv kernels/cuda_kbias.py kernels/cuda.py; rm kernels/cuda_main.py
  MLXCEL_POISON_OUTPUTS=nan timeout 280 python3 -m pytest -q -x tests/test_fused_kernels.py \
    tests/test_quantized_kv.py -k int8 > $OUT/kbias-tests/pytest.txt 2>&1
  echo "tests exit $? at $SECONDS s"; tail -1 $OUT/kbias-tests/pytest.txt | cut -c1-300 ;;
esac
