#!/usr/bin/env bash
# tests/map-check.sh — tests/README.md maps every module to its tests: each
# source git tracks under server/, engine/, proto/ and clients/ (.c, .cu)
# must be named there, and every file the README names (a `path` with a
# slash and an extension, from the repository root; build/ outputs and
# placeholders in capitals aside) must exist.
set -euo pipefail
cd "$(dirname "$0")/.."
readme=tests/README.md
status=0

named=$(grep -o '`[^` ]*/[^` ]*\.[a-z]\+`' "$readme" | tr -d '`' | grep -v '^build/' |
  grep -v '[A-Z]' | sort -u)

for src in $(git ls-files 'server/*.c' 'engine/*.c' 'engine/*.cu' 'proto/*.c' 'clients/*.c'); do
  if ! grep -qxF "$src" <<<"$named"; then
    echo "tests/map-check: $src is not in $readme: add a row saying which tests cover it" >&2
    status=1
  fi
done

for f in $named; do
  if [ ! -e "$f" ]; then
    echo "tests/map-check: $readme names $f, which does not exist: fix or remove it" >&2
    status=1
  fi
done

[ "$status" = 0 ] && echo "tests/map-check: $readme maps every source to existing tests"
exit "$status"
