#!/usr/bin/env bash
# Builds FlashInfer for the offline H200 machine, small enough to carry in one
# device call (~10 MB; the 0.7.4 wheel is 101 MB, 715 MB unpacked):
#   .fi-bundle/  (git-ignored)  flashinfer-0.7.4-cascade.tar.gz, wheels/, install.sh
# Kept: the files listed in scripts/flashinfer_bundle.manifest (what
# `import flashinfer.cascade` loads, the batch-prefill and cascade JIT sources,
# the header trees they include), every one byte-identical to the wheel, except
# flashinfer/__init__.py: the stock one imports nearly every submodule (MoE,
# GEMM, cute-dsl, ...) and with them packages the GPU image lacks, so the
# bundle's exposes only the version and `jit`; import flashinfer.cascade.
# Wheels: apache-tvm-ffi (flashinfer.jit loads its modules through it) and
# nvidia-ml-py (flashinfer.utils imports pynvml); the image has the rest.
# On the GPU machine (carry .fi-bundle): bash .fi-bundle/install.sh [/tmp/fisite],
# then PYTHONPATH=/tmp/fisite:... and CUDA_HOME=/usr/local/cuda (the JIT's nvcc).
set -euo pipefail
V=0.7.4
top=$(git rev-parse --show-toplevel)
cd "$top"
grep -qxF "/.fi-bundle/" .git/info/exclude || echo "/.fi-bundle/" >> .git/info/exclude
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
download() {  # download DIR SPEC...
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform any -d "$@"
}
download "$tmp" "flashinfer-python==$V"
rm -rf .fi-bundle && mkdir -p .fi-bundle/wheels
download .fi-bundle/wheels "apache-tvm-ffi==0.1.15.post2" "nvidia-ml-py==13.615.71"
python3 - "$tmp"/flashinfer_python-"$V"-*.whl "$tmp/keep" scripts/flashinfer_bundle.manifest <<'PY'
import sys, zipfile
from pathlib import Path
wheel, keep, manifest = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
wanted = [line.strip() for line in open(manifest) if line.strip() and not line.startswith("#")]
with zipfile.ZipFile(wheel) as z:
    names = z.namelist()
    for entry in wanted:
        matches = [n for n in names if n.startswith(entry)] if entry.endswith("/") else [entry] * (entry in names)
        if not matches:
            sys.exit(f"{entry} is not in {wheel}")
        for name in matches:
            if not name.endswith("/"):
                z.extract(name, keep)
PY
cat > "$tmp/keep/flashinfer/__init__.py" <<'PY'
"""FlashInfer pared down to its cascade attention (mlxcel-tui's scripts/flashinfer_bundle.sh):
import flashinfer.cascade (or .prefill, .decode) explicitly."""

from .version import __version__ as __version__
from .version import __git_commit__ as __git_commit__
from .version import __git_version__ as __git_version__

from . import jit as jit
PY
tar czf ".fi-bundle/flashinfer-$V-cascade.tar.gz" -C "$tmp/keep" flashinfer
cat > .fi-bundle/install.sh <<'SH'
#!/usr/bin/env bash
# Unpacks the pared-down FlashInfer into ${1:-/tmp/fisite} and installs its two wheels there.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dest=${1:-/tmp/fisite}
mkdir -p "$dest"
rm -rf "$dest/flashinfer"
tar xzf "$here"/flashinfer-*-cascade.tar.gz -C "$dest"
python3 -m pip install -q --no-index --no-deps --target "$dest" "$here"/wheels/*.whl
PYTHONPATH=$dest python3 -c "import flashinfer, flashinfer.cascade; print('flashinfer', flashinfer.__version__)"
SH
chmod +x .fi-bundle/install.sh
du -sh .fi-bundle
