"""Use Debian's OpenBLAS for MLX's CPU matmuls when the machine has it.

The Linux `mlx[cpu]` wheel bundles the reference (netlib) BLAS, about 35x
slower than OpenBLAS on matmuls here. Preloading libopenblas makes MLX's BLAS
calls resolve to it; the dynamic loader only honours LD_PRELOAD at process
start, so the command re-executes itself once with it set. Opt out with
MLXCEL_OPENBLAS=0.
"""

from __future__ import annotations

import os
import sys

OPENBLAS_PATHS = (
    "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/libopenblas.so.0",
)
MARKER = "MLXCEL_OPENBLAS_REEXEC"


def openblas_library() -> str | None:
    return next((p for p in OPENBLAS_PATHS if os.path.exists(p)), None)


def active() -> bool:
    return "libopenblas" in os.environ.get("LD_PRELOAD", "")


def reexec_with_openblas() -> None:
    """Replace this process with itself under LD_PRELOAD=libopenblas, once."""
    if not sys.platform.startswith("linux") or os.environ.get("MLXCEL_OPENBLAS", "1") == "0":
        return
    if active() or os.environ.get(MARKER):
        return
    library = openblas_library()
    if library is None:
        return
    env = dict(os.environ)
    env["LD_PRELOAD"] = ":".join(p for p in (library, env.get("LD_PRELOAD")) if p)
    env[MARKER] = "1"
    os.execve(sys.executable, [sys.executable, *sys.argv], env)


def describe() -> str:
    return "OpenBLAS (preloaded)" if active() else "bundled reference BLAS"
