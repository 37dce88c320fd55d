#!/usr/bin/env bash
# Builds the python-ticker component against this repository's wit/ (world
# `process-plugin`) with the pinned componentize-py (`.ci/setup` installs it).
#   plugins/examples/python-ticker/build.sh [OUTPUT]
# OUTPUT defaults to target/python-ticker.wasm here (gitignored).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
exec "$here/../componentize-python.sh" "$here" process-plugin "$@"
