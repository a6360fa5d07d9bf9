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
    if os.path.exists("/bin/true"):  # tried on a tiny process first: a library that cannot load
        probe = subprocess.run(["/bin/true"], env=env, capture_output=True)  # stops or warns every command
        if probe.returncode or probe.stderr:
            return None
    return env


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
