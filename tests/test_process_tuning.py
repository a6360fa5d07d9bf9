"""The console scripts' process set-up: OpenBLAS re-exec and glibc heap tuning."""

import os
import platform
import subprocess
import sys

import pytest

from mlxcel.engine import allocator, blas


def test_heap_tuning_applies_on_glibc_and_can_be_turned_off(monkeypatch):
    if not sys.platform.startswith("linux"):
        pytest.skip("glibc's mallopt exists on Linux only")
    assert allocator.keep_heap() is True
    monkeypatch.setenv("MLXCEL_MALLOC_TUNING", "0")
    assert allocator.keep_heap() is False


@pytest.mark.skipif(blas.openblas_library() is None, reason="no OpenBLAS here (Debian's nor the wheel's)")
def test_console_script_reexecs_once_with_openblas_preloaded(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", blas.MARKER, "MLXCEL_OPENBLAS")}
    script = tmp_path / "entry.py"  # a console script is a file re-run with its own argv
    script.write_text("import os, sys\nfrom mlxcel.engine import blas\nprint('start', flush=True)\n"
                      "blas.reexec_with_openblas()\nprint(os.environ.get('LD_PRELOAD', ''), blas.describe(), sys.argv[1:])\n")
    out = subprocess.run([sys.executable, str(script), "--flag"], env=env, capture_output=True, text=True,
                         check=True).stdout
    assert out.count("start") == 2, "re-executed exactly once"
    assert blas.openblas_library() in out and "OpenBLAS" in out and "['--flag']" in out
    env["MLXCEL_OPENBLAS"] = "0"
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, check=True).stdout
    assert out.count("start") == 1 and "bundled reference BLAS" in out


def wheel_library_fits_cpu() -> bool:
    """Whether this CPU has what the pinned wheel's library was built for (x86-64: AVX2 and FMA)."""
    if platform.machine() != "x86_64":
        return True
    with open("/proc/cpuinfo") as info:
        flags = set(next(line for line in info if line.startswith("flags")).split(":")[1].split())
    return {"avx2", "fma"} <= flags


def test_without_debians_openblas_the_wheels_one_is_preloaded_with_numpys_libgfortran(tmp_path, monkeypatch):
    """This machine's case (no Debian OpenBLAS): the cmeel-openblas wheel's library
    loads because a folder of links names numpy's libgfortran as the loader wants,
    and is preloaded where this CPU has the instructions it was built for (x86-64:
    AVX2 and FMA, the ZEN target of the pinned 0.3.29)."""
    if any(os.path.exists(p) for p in blas.DEBIAN_OPENBLAS):
        pytest.skip("Debian's OpenBLAS is installed: it is the one preloaded")
    monkeypatch.setenv("MLXCEL_HOME", str(tmp_path))
    library = blas.openblas_library()
    assert library.endswith("cmeel.prefix/lib/libopenblas.so.0")
    folder = blas.gfortran_folder(tmp_path)
    assert folder.parent == tmp_path / "openblas" and (folder / blas.GFORTRAN).resolve().is_file()
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]  # no staging folder left
    assert blas.gfortran_folder(tmp_path) == folder  # intact: reused
    env = blas.preload_env(library, {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"})
    if not wheel_library_fits_cpu():
        assert env is None, "a library built for AVX2 is never preloaded on a CPU without it"
        return
    assert env is not None and env["LD_LIBRARY_PATH"].split(":")[0] == str(folder)
    code = ("import ctypes, mlx.core as mx; a = mx.ones((64, 64)); f = ctypes.CDLL(None).openblas_get_config; "
            "f.restype = ctypes.c_char_p; print(float((a @ a).sum()), f())")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.startswith("262144.0 b'OpenBLAS")  # MLX's matmul ran with the library loaded
    assert env["OPENBLAS_NUM_THREADS"] == str(max(1, os.cpu_count() // 2))
    assert blas.preload_env(library, {"OPENBLAS_NUM_THREADS": "3"})["OPENBLAS_NUM_THREADS"] == "3"


@pytest.mark.skipif(blas.openblas_library() is None, reason="no OpenBLAS here (Debian's nor the wheel's)")
@pytest.mark.parametrize("ending", ["os.kill(os.getpid(), signal.SIGILL)", "sys.exit(3)", "print('x', file=sys.stderr)"])
def test_a_library_whose_sgemm_dies_or_is_wrong_is_never_preloaded(monkeypatch, ending):
    """The probe's verdict: a process killed by an instruction the CPU lacks, a
    wrong product (exit 3) or a warning means no preload; the real probe passes."""
    library = blas.openblas_library()
    runs_here = library in blas.DEBIAN_OPENBLAS or wheel_library_fits_cpu()
    assert (blas.preload_env(library, dict(os.environ)) is not None) == runs_here
    monkeypatch.setattr(blas, "SGEMM_PROBE", f"import os, signal, sys\n{ending}\n" + blas.SGEMM_PROBE)
    assert blas.preload_env(library, dict(os.environ)) is None


def test_a_library_that_would_not_load_is_never_preloaded(tmp_path):
    broken = tmp_path / "libopenblas.so.0"
    broken.write_bytes(b"not a shared object")
    assert blas.preload_env(str(broken), dict(os.environ)) is None


def test_an_unwritable_home_means_no_links_folder(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert blas.gfortran_folder(blocker / "home") is None


@pytest.mark.skipif(blas.openblas_library() is None, reason="no OpenBLAS here (Debian's nor the wheel's)")
def test_a_module_run_with_dash_m_reexecs_as_itself(tmp_path):
    (tmp_path / "probe.py").write_text("import os, sys\nfrom mlxcel.engine import blas\nprint('start', flush=True)\n"
                                       "blas.reexec_with_openblas()\nprint(blas.active(), sys.argv[1:])\n")
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", blas.MARKER, "MLXCEL_OPENBLAS")}
    out = subprocess.run([sys.executable, "-m", "probe", "--flag"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, check=True).stdout
    assert out.split("\n") == ["start", "start", "True ['--flag']", ""]
