"""HEAD's kernels (ab_step/cuda_head.py, with its own make_kernel) beside the working tree's."""
import importlib.util
from mlxcel.kernels import cuda

spec = importlib.util.spec_from_file_location("mlxcel.kernels.cuda_head", "ab_step/cuda_head.py")
head = importlib.util.module_from_spec(spec)
spec.loader.exec_module(head)
kernels = {"old": head.KERNELS, "new": cuda.KERNELS}
