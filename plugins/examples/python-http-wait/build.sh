#!/usr/bin/env bash
# Builds the python-http-wait component against this repository's wit/ (world
# `http-plugin`) with the pinned componentize-py (`.ci/setup` installs it).
#   plugins/examples/python-http-wait/build.sh [OUTPUT]
# OUTPUT defaults to target/python-http-wait.wasm here (gitignored).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
exec "$here/../componentize-python.sh" "$here" http-plugin "$@"
