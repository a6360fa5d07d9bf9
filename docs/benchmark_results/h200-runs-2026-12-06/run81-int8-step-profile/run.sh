# Run 81: where cascade int8's end-to-end step loses to cascade bf16's at 32 x 32K although its attention kernel
# does not (run 80): the step profile (PyTorch's profiler over 10 steady steps) of both arms of both page formats.
# Device calls: carry .whl-b .whl-lm after a call that copied .whl-a into /tmp/w. Output: out/.
set -u
source benchmarks/device_env.sh || exit 1
timeout 500 python3 benchmarks/gpu_step_profile.py --out $OUT/out --shared 32768 --kv-dtypes bfloat16,int8 \
  > $OUT/profile.log 2>&1
echo "profile exit $? at $SECONDS s"; head -12 $OUT/out/step_profile.md
