#!/usr/bin/env bash
# Install the pared-down FlashInfer 0.7.4 cascade bundle on an offline machine.
#
#   Copy the bundle halves a/ and b/ into /tmp/fib/ (either as /tmp/fib/a, /tmp/fib/b
#   or with their contents flattened into /tmp/fib/), then:
#       bash /tmp/fib/install.sh            # or bash /tmp/fib/a/install.sh
#   Then:
#       export PYTHONPATH=/tmp/fisite:$PYTHONPATH
#       python3 -c "import flashinfer.cascade"
#
# Env / args:  FIB=<dir holding the halves> (default /tmp/fib)
#              $1 = target site dir (default /tmp/fisite)
#              PYTHON=<interpreter> (default python3)
#              SKIP_SMOKE=1 to skip the final import check
set -euo pipefail

FIB="${FIB:-/tmp/fib}"
DEST="${1:-/tmp/fisite}"
PY="${PYTHON:-python3}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# Search the script's own dir, FIB, and their a/ b/ subfolders (and parents of HERE).
SEARCH=()
for d in "$FIB" "$FIB/a" "$FIB/b" "$HERE" "$HERE/a" "$HERE/b" "$HERE/.." "$HERE/../a" "$HERE/../b"; do
  [ -d "$d" ] && SEARCH+=("$(cd "$d" && pwd)")
done
# de-duplicate
mapfile -t SEARCH < <(printf '%s\n' "${SEARCH[@]}" | awk '!seen[$0]++')

find_one() {  # find_one NAME -> first match path
  local n="$1" d
  for d in "${SEARCH[@]}"; do
    [ -e "$d/$n" ] && { echo "$d/$n"; return 0; }
  done
  return 1
}

# 1) reassemble the flashinfer tarball from its parts (any number, any half)
mapfile -t PARTS < <(for d in "${SEARCH[@]}"; do ls "$d"/flashinfer-0.7.4-cascade.tar.gz.part-* 2>/dev/null || true; done \
                     | awk -F/ '!seen[$NF]++' | awk -F/ '{print $NF"\t"$0}' | sort | cut -f2)
[ "${#PARTS[@]}" -gt 0 ] || { echo "ERROR: no flashinfer-0.7.4-cascade.tar.gz.part-* found in: ${SEARCH[*]}" >&2; exit 1; }
TMPTGZ="$(mktemp /tmp/fib-flashinfer.XXXXXX.tar.gz)"
trap 'rm -f "$TMPTGZ"' EXIT
cat "${PARTS[@]}" > "$TMPTGZ"
echo "reassembled ${#PARTS[@]} part(s) -> $TMPTGZ ($(stat -c %s "$TMPTGZ") bytes)"

SUMS="$(find_one SHA256SUMS || true)"
if [ -n "$SUMS" ]; then
  want="$(awk '$2=="flashinfer-0.7.4-cascade.tar.gz"{print $1}' "$SUMS")"
  got="$(sha256sum "$TMPTGZ" | awk '{print $1}')"
  if [ -n "$want" ] && [ "$want" != "$got" ]; then
    echo "ERROR: checksum mismatch for flashinfer tarball (want $want, got $got)" >&2; exit 1
  fi
  echo "tarball checksum OK"
fi

# 2) unpack flashinfer into DEST
mkdir -p "$DEST"
rm -rf "$DEST/flashinfer"
tar xzf "$TMPTGZ" -C "$DEST"
echo "unpacked flashinfer into $DEST/flashinfer"

# 3) dependency wheels
TVMWHL="$(find_one wheels/apache_tvm_ffi-0.1.15.post2-cp312-cp312-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl || true)"
[ -n "$TVMWHL" ] || { echo "ERROR: wheels/ folder (with the apache-tvm-ffi wheel) not found in: ${SEARCH[*]}" >&2; exit 1; }
WHEELDIR="$(dirname "$TVMWHL")"
"$PY" -m pip install --no-index --no-deps --upgrade --target "$DEST" "$WHEELDIR"/*.whl

# 3b) optional wheels: only if the machine lacks them (they normally come with torch)
OPTDIR="$(dirname "$WHEELDIR")/optional-wheels"
if [ -d "$OPTDIR" ]; then
  if ! "$PY" -c "import jinja2, markupsafe" 2>/dev/null; then
    echo "jinja2/markupsafe missing -> installing bundled copies"
    "$PY" -m pip install --no-index --no-deps --upgrade --target "$DEST" "$OPTDIR"/jinja2-*.whl "$OPTDIR"/markupsafe-*.whl
  fi
  if ! "$PY" - <<'EOF' 2>/dev/null
import importlib.metadata as m, sys
v = tuple(int(x) for x in m.version("typing_extensions").split(".")[:2])
sys.exit(0 if v >= (4, 13) else 1)
EOF
  then
    echo "typing_extensions missing or < 4.13 (apache-tvm-ffi needs >= 4.13) -> installing bundled copy"
    "$PY" -m pip install --no-index --no-deps --upgrade --target "$DEST" "$OPTDIR"/typing_extensions-*.whl
  fi
fi

# 4) smoke test
if [ "${SKIP_SMOKE:-0}" != "1" ]; then
  PYTHONPATH="$DEST${PYTHONPATH:+:$PYTHONPATH}" "$PY" -c \
    "import flashinfer, flashinfer.cascade as c; print('flashinfer', flashinfer.__version__, 'from', flashinfer.__file__); print('OK', c.MultiLevelCascadeAttentionWrapper.__name__)"
fi
echo "done. Use:  export PYTHONPATH=$DEST:\$PYTHONPATH"
