# install, the full GPU test files, then two more reads of the full bench
bash ab_step/install.sh
export PYTHONPATH=/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks:$PWD/ab_step
MLXCEL_KERNELS=fused MLXCEL_POISON_OUTPUTS=nan timeout 200 python3 -m pytest -q tests/test_fused_kernels.py tests/test_cascade_planner.py -p no:cacheprovider -k "exponent_base" -rA 2>&1 | grep -E "passed|failed|relative_error|Error" | tail -8
MLXCEL_KERNELS=fused MLXCEL_POISON_OUTPUTS=nan timeout 200 python3 -m pytest -q tests/test_fused_kernels.py tests/test_cascade_planner.py -p no:cacheprovider --junitxml=$OUT/gpu_tests.xml 2>&1 | tail -3 | tee $OUT/tests.txt
for i in 1 2; do MLXCEL_KERNELS=fused timeout 200 python3 benchmarks/gpu_attention_bench.py --out $OUT/bench$i --shared 2048,8192,32768 --batches 4,8,32,64 --reps 10 --copy-mib 256 --matmul-n 4096 2>&1 | grep -E "^\| (8192|2048|32768) \| (4|32) "; done
