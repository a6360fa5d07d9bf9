"""Run 94's `tma-off` arm: the TMA switch off before the engine loads (gate/up on the skinny kernel)."""
from mlxcel.kernels import cuda_matmul

cuda_matmul.TMA = False
