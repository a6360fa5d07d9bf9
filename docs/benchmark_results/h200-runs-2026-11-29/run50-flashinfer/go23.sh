# FlashInfer 0.7.4 (pared-down bundle, JIT on this machine) beside the fused cascade and MLX SDPA
bash ab_step/install.sh
FIB=$PWD/.fi-bundle bash .fi-bundle/install.sh > $OUT/fi_install.txt 2>&1; tail -3 $OUT/fi_install.txt
export PYTHONPATH=/tmp/fisite:/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks:$PWD/ab_step
export CUDA_HOME=/usr/local/cuda MAX_JOBS=16 MLXCEL_KERNELS=fused
timeout 480 python3 ab_step/flashinfer_cells.py $OUT 8192x32,2048x64,32768x32,8192x4 > $OUT/flashinfer.txt 2>&1
echo "fi done $SECONDS s"; tail -12 $OUT/flashinfer.txt
