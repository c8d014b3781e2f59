#!/usr/bin/env bash
# The README's demo: record the C++ example for a few steps and list the
# recording. Called by ./setup.sh demo with the build directory.
set -euo pipefail
BUILD="${1:-build}"
OUT="$(mktemp -d /tmp/opguard-demo-XXXXXX)"
echo "== opguard record --out $OUT/runA -- tiny_gpt --steps 3"
"$BUILD/bin/opguard" record --out "$OUT/runA" -- "$BUILD/bin/tiny_gpt" --steps 3
echo
echo "== opguard ls $OUT/runA"
"$BUILD/bin/opguard" ls "$OUT/runA"
