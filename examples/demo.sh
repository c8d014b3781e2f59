#!/usr/bin/env bash
# The README's demo: record the C++ example twice, under 2 and under 1 intra-op
# threads (one numerics knob), name the first divergent operator, then run the
# whole pipeline: `opguard bisect run` re-records the window around it with full
# tensors, replays it under both runs' configs, bisects the configuration to the
# knob that flips the bits, shrinks the inputs and writes a checked repro bundle.
# Called by ./setup.sh demo with the build directory.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUILD="$(cd "${1:-build}" && pwd)"
OG="$BUILD/bin/opguard"
PY="${OPGUARD_PYTHON:-$ROOT/.venv/bin/python}"
OUT="$(mktemp -d /tmp/opguard-demo-XXXXXX)"
cd "$OUT"
echo "== opguard record --out runA -- tiny_gpt --steps 3 --threads 2"
"$OG" record --out runA -- "$BUILD/bin/tiny_gpt" --steps 3 --threads 2
echo
echo "== opguard record --out runB -- tiny_gpt --steps 3 --threads 1"
"$OG" record --out runB -- "$BUILD/bin/tiny_gpt" --steps 3 --threads 1
echo
echo "== opguard ls runB"
"$OG" ls runB
echo
echo "== opguard diff runA runB --max-origins 1 --trace divergence.json"
rc=0
"$OG" diff runA runB --max-origins 1 --trace divergence.json || rc=$?
echo "(exit code $rc: 3 means the runs diverge)"
echo
echo "== opguard bisect run runA runB -o bisect-out --check-with python"
rc=0
"$OG" bisect run runA runB -o bisect-out --check-with "$PY" || rc=$?
echo "(exit code $rc)"
if [ -d bisect-out/bundle ]; then
  echo
  echo "== the bundle: ls bisect-out/bundle; cat bisect-out/bundle/README.md"
  ls bisect-out/bundle
  cat bisect-out/bundle/README.md
fi
echo
echo "demo files are in $OUT (divergence.json opens in ui.perfetto.dev)"
exit "$rc"
