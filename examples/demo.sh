#!/usr/bin/env bash
# The README's demo: record the C++ example twice, under 2 and under 1 intra-op
# threads (one numerics knob), find the first divergent operator, re-record the
# window around it with full tensors, and diff again for element-wise evidence.
# Called by ./setup.sh demo with the build directory.
set -euo pipefail
BUILD="$(cd "${1:-build}" && pwd)"
OG="$BUILD/bin/opguard"
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
# The commands diff printed to re-record the window with full tensors.
"$OG" diff runA runB --json > diff.json || true
ID="$(python3 -c 'import json; print(json.load(open("diff.json"))["first_divergent"]["suspect_id"])')"
echo "== re-record the window around event $ID in both runs (the commands diff printed)"
python3 -c 'import json; print(json.load(open("diff.json"))["first_divergent"]["rerecord_command"])' > rerecord.sh
sh rerecord.sh > /dev/null 2>&1
echo
echo "== opguard diff runA-around-$ID runB-around-$ID --max-origins 1"
rc=0
"$OG" diff "runA-around-$ID" "runB-around-$ID" --max-origins 1 || rc=$?
echo "(exit code $rc)"
echo
echo "demo files are in $OUT (divergence.json opens in ui.perfetto.dev)"
