#!/usr/bin/env sh
# Runs the main job: engine + shared-prompt sessions + server + dashboard on the
# embedded default model. Extra arguments go to `mlxcel-tui serve`.
set -eu
. "$(dirname "$0")/venv.sh"
exec "$venv/bin/mlxcel-tui" serve "$@"
