#!/usr/bin/env bash
# Builds a Python example's component (its app.py) against this repository's
# wit/ with the pinned componentize-py (`.ci/setup` installs it); each
# example's build.sh calls it with its directory and world.
#   plugins/examples/componentize-python.sh EXAMPLE_DIR WORLD [OUTPUT]
# OUTPUT defaults to EXAMPLE_DIR/target/<example name>.wasm (gitignored).
#
# componentize-py 0.25.1 output differs on every build of the same source
# (its pre-initialized interpreter snapshot is not deterministic; no
# environment variable fixes that), so a build of unchanged sources keeps
# the existing OUTPUT: the host's compile cache then hits and `taskhost dev
# --watch` sees no new plugin. The sources' hash is kept in OUTPUT.source;
# FORCE=1 rebuilds anyway.
set -euo pipefail
here="$(cd "$1" && pwd)"
world="$2"
wit="$(cd "$(dirname "$0")/../../wit" && pwd)"
out="${3:-$here/target/$(basename "$here").wasm}"
pinned=0.25.1
if ! version="$(componentize-py --version 2>/dev/null)"; then
  echo "componentize-py is not installed: run .ci/setup (or: python3 -m pip install componentize-py==$pinned)" >&2
  exit 127
fi
case "$version" in
  *" $pinned") ;;
  *) echo "warning: $version, this example is pinned to componentize-py $pinned" >&2 ;;
esac
source_hash="$(cd "$here" && { echo "$version $world"; cat app.py; find "$wit" -name '*.wit' | LC_ALL=C sort | xargs cat; } | sha256sum | cut -d' ' -f1)"
if [ "${FORCE:-0}" != 1 ] && [ -f "$out" ] && [ "$(cat "$out.source" 2>/dev/null)" = "$source_hash" ]; then
  echo "$out is up to date (sources unchanged)"
  exit 0
fi
mkdir -p "$(dirname "$out")"
out="$(cd "$(dirname "$out")" && pwd)/$(basename "$out")"
# Built from a copy: the build's interpreter writes __pycache__ next to the
# sources it imports.
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
cp "$here/app.py" "$stage/"
cd "$stage"
componentize-py -d "$wit" -w "$world" componentize app -p "$stage" -o "$out"
echo "$source_hash" > "$out.source"
