"""The console scripts' process set-up: OpenBLAS re-exec and glibc heap tuning."""

import os
import subprocess
import sys

import pytest

from mlxcel_tui import allocator, blas


def test_heap_tuning_applies_on_glibc_and_can_be_turned_off(monkeypatch):
    if not sys.platform.startswith("linux"):
        pytest.skip("glibc's mallopt exists on Linux only")
    assert allocator.keep_heap() is True
    monkeypatch.setenv("MLXCEL_MALLOC_TUNING", "0")
    assert allocator.keep_heap() is False


@pytest.mark.skipif(blas.openblas_library() is None, reason="Debian's libopenblas0 is not installed here")
def test_console_script_reexecs_once_with_openblas_preloaded(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", blas.MARKER, "MLXCEL_OPENBLAS")}
    script = tmp_path / "entry.py"  # a console script is a file re-run with its own argv
    script.write_text("import os, sys\nfrom mlxcel_tui import blas\nprint('start', flush=True)\n"
                      "blas.reexec_with_openblas()\nprint(os.environ.get('LD_PRELOAD', ''), blas.describe(), sys.argv[1:])\n")
    out = subprocess.run([sys.executable, str(script), "--flag"], env=env, capture_output=True, text=True,
                         check=True).stdout
    assert out.count("start") == 2, "re-executed exactly once"
    assert blas.openblas_library() in out and "OpenBLAS" in out and "['--flag']" in out
    env["MLXCEL_OPENBLAS"] = "0"
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, check=True).stdout
    assert out.count("start") == 1 and "bundled reference BLAS" in out
