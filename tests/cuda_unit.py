"""The translation unit MLX's ``mx.fast.cuda_kernel`` builds around a kernel
body (mlx/backend/cuda/custom_kernel.cpp, ``build_kernel``), so the fused
sources can be compiled by nvcc on a machine without a GPU.

MLX 0.32.4 prepends only its device utilities (utils.cuh) and
cooperative_groups.h; those utilities ship inside libmlx, not on disk, so the
prelude here declares the one name the generated signature uses (``Shape``)
from the CUDA toolkit's own headers, and nothing more: a source that leans on
anything else MLX might define fails here as it would on the GPU.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from mlxcel.kernels.fused import compact_source

PRELUDE = r"""
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda/std/array>
#include <cooperative_groups.h>
namespace mlx::core::cu {
using Shape = cuda::std::array<int32_t, 10>;
}
"""

CUDA_TYPES = {"float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16", "int32": "int32_t",
              "int8": "int8_t", "uint8": "uint8_t"}


def translation_unit(name: str, header: str, source: str, inputs: list[tuple[str, str]],
                     outputs: list[tuple[str, str]], template: list[tuple[str, object]]) -> str:
    """inputs/outputs: (name, dtype name); template: (name, bool, int or dtype name).
    The header and source are compacted as ``FusedKernels`` hands them to MLX."""
    header, source = compact_source(header), compact_source(source)
    params = []
    for arg, dtype in inputs:
        params.append(f"    const {CUDA_TYPES[dtype]}* {arg}")
        if f"{arg}_shape" in source:
            params.append(f"    const __grid_constant__ Shape {arg}_shape")
        if f"{arg}_ndim" in source:
            params.append(f"    const __grid_constant__ int {arg}_ndim")
    params += [f"    {CUDA_TYPES[dtype]}* {arg}" for arg, dtype in outputs]
    def constant(name, value) -> str:
        if isinstance(value, bool):
            return f"  constexpr bool {name} = {str(value).lower()};\n"
        if isinstance(value, int):
            return f"  constexpr int {name} = {value};\n"
        return f"  using {name} = {CUDA_TYPES[value]};\n"

    constants = "".join(constant(k, v) for k, v in template)
    return (PRELUDE + header + "namespace mlx::core::cu {\n\nnamespace cg = cooperative_groups;\n\n"
            f"__global__ void {name}(\n" + ",\n".join(params) + ") {\n" + constants + "\n" + source
            + "\n}\n\n} // namespace mlx::core::cu\n")


def nvcc() -> str | None:
    return shutil.which("nvcc")


def compile_unit(text: str, workdir: Path, arch: str = "sm_90") -> str:
    """Compile to a cubin with ptxas's resource report; returns the report.
    Raises CalledProcessError (with nvcc's messages) on a compile error."""
    path = workdir / "unit.cu"
    path.write_text(text)
    result = subprocess.run(
        [nvcc(), f"-arch={arch}", "-std=c++17", "-cubin", "-Xptxas", "-v", "-o", str(workdir / "unit.cubin"),
         str(path)], capture_output=True, text=True)
    if result.returncode:
        raise subprocess.CalledProcessError(result.returncode, result.args, result.stdout, result.stderr)
    return result.stderr


def resources(report: str) -> tuple[int, int]:
    """(registers a lane, bytes spilled) from ptxas's report."""
    registers = int(re.search(r"Used (\d+) registers", report).group(1))
    spills = sum(int(n) for n in re.findall(r"(\d+) bytes spill", report))
    return registers, spills
