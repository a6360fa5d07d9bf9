#!/usr/bin/env sh
# Creates .venv in the checkout if missing and (re)installs the project into it
# whenever pyproject.toml changed since the last install, with [tool.mlxcel] no-deps
# installed without their dependencies. Sourced by the other scripts.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
venv="$root/.venv"
py=${PYTHON:-python3}
if [ ! -x "$venv/bin/python" ]; then
  echo "mlxcel: creating $venv" >&2
  "$py" -m venv "$venv"
fi
stamp="$venv/.mlxcel-installed"
want=$(cksum "$root/pyproject.toml" | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "mlxcel: installing mlxcel-tui and its dependencies into $venv" >&2
  "$venv/bin/python" -m pip install -q --upgrade pip >&2
  "$venv/bin/python" -m pip install -q -e "$root[test]" >&2
  # shellcheck disable=SC2046  # one word per requirement
  "$venv/bin/python" -m pip install -q --no-deps $("$venv/bin/python" -c \
    'import sys, tomllib; print(" ".join(tomllib.load(open(sys.argv[1], "rb"))["tool"]["mlxcel"]["no-deps"]))' \
    "$root/pyproject.toml") >&2
  echo "$want" > "$stamp"
fi
