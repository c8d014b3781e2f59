#!/bin/bash
# Run-to-run reproducibility of the C++ example on a loaded machine (manual;
# not part of ctest: it takes minutes and measures a rate).
#
#   tests/examples/under_load.sh [-n RUNS] [-b BUILD] [-- ENV=VALUE ...] [:: TINY_GPT ARGS ...]
#
# Starts one busy loop per core, runs build/bin/tiny_gpt RUNS times (default
# 200; args default `--steps 3 --tied --dtype float64`) under the given
# environment, and prints how many runs gave each final-parameter checksum
# (and how many failed): one line means every run agreed.
set -euo pipefail
runs=200
build="$(cd "$(dirname "$0")/../.." && pwd)/build"
env_settings=()
args=(--steps 3 --tied --dtype float64)
while [ $# -gt 0 ]; do
  case "$1" in
    -n) runs="$2"; shift 2 ;;
    -b) build="$2"; shift 2 ;;
    --) shift; while [ $# -gt 0 ] && [ "$1" != "::" ]; do env_settings+=("$1"); shift; done ;;
    ::) shift; args=("$@"); break ;;
    *) echo "under_load.sh: unknown argument '$1' (see the header of this script)" >&2; exit 2 ;;
  esac
done
bin="$build/bin/tiny_gpt"
[ -x "$bin" ] || { echo "under_load.sh: no $bin (build first)" >&2; exit 2; }
dir=$(mktemp -d)
busy=()
cleanup() { kill "${busy[@]}" 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT
for _ in $(seq "$(nproc)"); do (while :; do :; done) & busy+=($!); done
for _ in $(seq "$runs"); do
  rm -f "$dir/params.bin"
  if env ${env_settings[@]+"${env_settings[@]}"} "$bin" "${args[@]}" --out-params "$dir/params.bin" >/dev/null 2>&1; then
    md5sum < "$dir/params.bin" | cut -c1-8
  else
    echo "failed (the run exited non-zero)"
  fi
done | sort | uniq -c
