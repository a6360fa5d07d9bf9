"""A benchmark run with the CUDA platform's level-0 staging ring set (the run's own choice, from its sweep):
python with_level0_stages.py STAGES SCRIPT [ARGS...]. Ran at e8b6a1f, whose Platform had a level0_stages field
(dropped after this run: the sweep kept the double buffer)."""
import dataclasses
import runpy
import sys

from mlxcel.kernels import cuda

cuda.KERNELS.platform = dataclasses.replace(cuda.KERNELS.platform, level0_stages=int(sys.argv[1]))
print("level0_stages", cuda.KERNELS.platform.level0_stages, flush=True)
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
