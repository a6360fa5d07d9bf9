"""Use OpenBLAS for MLX's CPU matmuls on Linux.

The Linux `mlx[cpu]` wheel bundles the reference (netlib) BLAS: a 1024x1024
float32 matmul takes ~350 ms on the 2-core CPU measured, ~15-40 ms with
OpenBLAS. Preloading libopenblas makes MLX's BLAS calls resolve to it; the
dynamic loader only honours LD_PRELOAD at process start, so the command
re-executes itself once with it set (and OPENBLAS_NUM_THREADS, unless set).
Opt out with MLXCEL_OPENBLAS=0.

Which OpenBLAS: Debian's where it is installed, else the one the
`cmeel-openblas` wheel (a dependency) ships. That library needs
`libgfortran.so.5`, which a plain machine lacks but numpy's wheel carries
under a hashed name (with its libquadmath); a folder of links under
$MLXCEL_HOME/openblas/ gives the loader the names it looks for.

The wheel's library is built for one CPU family (not OpenBLAS's DYNAMIC_ARCH):
0.3.29's for AVX2 (ZEN), 0.3.31's for AVX-512 (SKYLAKEX), which dies of SIGILL
on the first matmul of a CPU without AVX-512. So the preload is tried first on
a small process that runs one sgemm through it and checks the product; where
that fails, nothing is preloaded.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

DEBIAN_OPENBLAS = (
    "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/libopenblas.so.0",
)
WHEEL_OPENBLAS = ("cmeel-openblas", "cmeel.prefix/lib/libopenblas.so.0")
GFORTRAN = "libgfortran.so.5"
MARKER = "MLXCEL_OPENBLAS_REEXEC"
# One 64x64 sgemm through whatever `cblas_sgemm` the process resolves: with the
# library preloaded, its kernels run (an instruction the CPU lacks kills the probe).
SGEMM_PROBE = """
import ctypes, sys
n = 64
a = (ctypes.c_float * (n * n))(*[(i % 7) - 3.0 for i in range(n * n)])
c = (ctypes.c_float * (n * n))()
blas = ctypes.CDLL(None)
blas.cblas_sgemm.restype = None
blas.cblas_sgemm(101, 111, 112, n, n, n, ctypes.c_float(1.0), a, n, a, n, ctypes.c_float(0.0), c, n)
cells = ((0, 0), (5, 9), (63, 1))
want = [sum(a[i * n + k] * a[j * n + k] for k in range(n)) for i, j in cells]
sys.exit(0 if [c[i * n + j] for i, j in cells] == want else 3)
"""


def openblas_library() -> str | None:
    """Debian's OpenBLAS if installed, else the cmeel-openblas wheel's."""
    return next((p for p in DEBIAN_OPENBLAS if os.path.exists(p)), None) or _wheel_library()


def _wheel_library() -> str | None:
    try:
        path = importlib.metadata.distribution(WHEEL_OPENBLAS[0]).locate_file(WHEEL_OPENBLAS[1])
    except importlib.metadata.PackageNotFoundError:
        return None
    return str(path) if Path(path).is_file() else None


def gfortran_folder(home: Path | None = None) -> Path | None:
    """A folder of links where the loader finds libgfortran.so.5 and its
    libquadmath, from numpy's wheel; None where none can be made."""
    from .model_cache import mlxcel_home

    carried = _carried_gfortran()
    if carried is None:
        return None
    links = {GFORTRAN: carried, **{p.name: p for p in carried.parent.glob("libquadmath*.so*")}}
    key = hashlib.sha256("\n".join(f"{k}={v}" for k, v in sorted(links.items())).encode()).hexdigest()[:16]
    folder = mlxcel_home(home) / "openblas" / key
    if all((folder / name).resolve() == target.resolve() for name, target in links.items()):
        return folder
    try:  # made in a temporary folder and renamed: a reader never sees half of it
        folder.parent.mkdir(parents=True, exist_ok=True)
        staged = Path(tempfile.mkdtemp(prefix=".links-", dir=folder.parent))
    except OSError:
        return None
    try:
        for name, target in links.items():
            (staged / name).symlink_to(target)
        os.rename(staged, folder)
    except OSError:
        pass  # another process made it first, or the folder cannot be written
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    return folder if folder.is_dir() else None


def _carried_gfortran() -> Path | None:
    spec = importlib.util.find_spec("numpy")  # finds without importing
    if spec is None or spec.origin is None:
        return None
    return next(iter(sorted((Path(spec.origin).parent.parent / "numpy.libs").glob("libgfortran*.so.5*"))), None)


def preload_env(library: str, environ: dict[str, str]) -> dict[str, str] | None:
    """The environment that preloads ``library``, or None where it would not load
    (the wheel's OpenBLAS without a libgfortran): the loader would refuse to start."""
    env = dict(environ)
    if library not in DEBIAN_OPENBLAS and not ctypes.util.find_library("gfortran"):
        folder = gfortran_folder()
        if folder is None:
            return None
        env["LD_LIBRARY_PATH"] = ":".join(p for p in (str(folder), env.get("LD_LIBRARY_PATH")) if p)
    env["LD_PRELOAD"] = ":".join(p for p in (library, env.get("LD_PRELOAD")) if p)
    env.setdefault("OPENBLAS_NUM_THREADS", str(openblas_threads()))
    return env if runs_sgemm(env) else None


def runs_sgemm(env: dict[str, str]) -> bool:
    """Whether a process started with ``env`` computes an sgemm right and quietly:
    a library that cannot load stops (or warns on) every command, one built for
    instructions this CPU lacks kills it (SIGILL)."""
    try:
        probe = subprocess.run([sys.executable, "-c", SGEMM_PROBE], env=env, capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0 and not probe.stderr


def openblas_threads() -> int:
    """Half the cores, at least one. OpenBLAS's workers spin between calls and
    take the cores from the ops MLX runs between matmuls: on the 2-core machine
    measured, one thread against two made a decode step of 8 sequences ~4x and
    a 512-token prefill ~3x faster (larger machines were not measured)."""
    return max(1, (os.cpu_count() or 2) // 2)


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
    env = preload_env(library, dict(os.environ))
    if env is None:
        return
    env[MARKER] = "1"
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)  # orig_argv keeps `-m module`


def describe() -> str:
    """Which BLAS serves MLX's CPU matmuls, as the header shows it."""
    if not active():
        return "bundled reference BLAS"
    where = "Debian" if any(p in os.environ["LD_PRELOAD"] for p in DEBIAN_OPENBLAS) else "cmeel-openblas wheel"
    try:
        process = ctypes.CDLL(None)
        process.openblas_get_config.restype = ctypes.c_char_p
        version = process.openblas_get_config().decode().split()[1]
        threads = process.openblas_get_num_threads()
    except (AttributeError, IndexError, OSError):  # preloaded, but not (yet) loaded in this process
        return f"OpenBLAS ({where}, preloaded)"
    return f"OpenBLAS {version} ({where}, preloaded, {threads} thread{'s' * (threads != 1)})"
