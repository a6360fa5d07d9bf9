#!/usr/bin/env sh
# Runs the whole test suite. Extra arguments go to pytest.
set -eu
. "$(dirname "$0")/venv.sh"
cd "$root"
exec "$venv/bin/python" -m pytest -q "$@"
