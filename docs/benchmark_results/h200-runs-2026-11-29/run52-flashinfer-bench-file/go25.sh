# the committed FlashInfer bench file, installed as gpu_suite.sh would
bash ab_step/install.sh
bash .fi-bundle/install.sh /tmp/fisite > $OUT/fi_install.txt 2>&1; tail -1 $OUT/fi_install.txt
PYTHONPATH=/tmp/fisite:/tmp/site:/tmp/mlxcel-shim:$PWD:$PWD/tests:$PWD/benchmarks CUDA_HOME=/usr/local/cuda MLXCEL_KERNELS=fused \
  timeout 400 python3 benchmarks/gpu_flashinfer_bench.py --out $OUT > $OUT/flashinfer_bench.log 2>&1
echo "done $SECONDS s"; tail -8 $OUT/flashinfer_bench.log
