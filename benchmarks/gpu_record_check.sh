#!/usr/bin/env bash
# Recording on a GPU, with the binaries built here, on a machine that has a
# GPU and torch but not the Debian packages the CMake build needs:
#   1. records tiny_gpt --device cuda twice and diffs the two recordings;
#   2. records the same model on the CPU and diffs CPU against GPU: inputs
#      drawn on the CPU and moved to the GPU must have the same fingerprints
#      (fingerprints do not depend on the device), so the diff can name the
#      first operator that computed different bits from identical inputs;
#   3. step times: unrecorded, recorded with CUDA tensors hashed on the device
#      (libopguard_record_cuda.so), and recorded with them copied to the host
#      (the module removed: what the recorder did before it had one);
#   4. records tiny_gpt.py --device cuda (the Python way in);
#   5. records non_blocking device-to-host copies twice: the same fingerprints;
#   6. replays every event of a CPU recording on the GPU (device=cuda:0).
#
# Usage (repository root):
#   benchmarks/gpu_record_check.sh --prepare DIR [BUILD_DIR]   here: copy the
#       opguard CLI, tiny_gpt and the recorder (stripped), the Python package
#       and the shared libraries they need that are not torch's or glibc's
#       into DIR, to carry to the GPU machine.
#   GPU_RECORD_DIR=DIR benchmarks/gpu_record_check.sh   there.
# Exit status: 0 when every check passed, 1 when one failed.
set -u
ROOT="$(cd "$(dirname "$0")/.." && pwd)"

if [ "${1:-}" = "--prepare" ]; then
  DIR="${2:?--prepare needs a directory}"
  BUILD="${3:-$ROOT/build}"
  rm -rf "$DIR" && mkdir -p "$DIR/bin" "$DIR/lib" "$DIR/deps"
  for f in opguard tiny_gpt; do strip -o "$DIR/bin/$f" "$BUILD/bin/$f"; done
  for f in libopguard_record.so libopguard_record_cuda.so; do strip -o "$DIR/lib/$f" "$BUILD/lib/$f"; done
  cp -r "$ROOT/python" "$DIR/python"
  find "$DIR/python" -name __pycache__ -prune -exec rm -rf {} +
  # Everything ldd resolves outside torch's wheel, the CUDA toolkit and glibc.
  ldd "$DIR"/bin/* "$DIR"/lib/*.so | awk '/=> \// {print $3}' | sort -u |
    grep -v -e '/torch/' -e '/nvidia/' -e '/cuda' -e '/libc\.so' -e '/libm\.so' -e '/libpthread' \
            -e '/libdl\.so' -e '/librt\.so' -e '/ld-linux' |
    while read -r lib; do cp -L "$lib" "$DIR/deps/"; done
  du -sh "$DIR"
  exit 0
fi

DIR="${GPU_RECORD_DIR:?set GPU_RECORD_DIR to the directory --prepare made}"
DIR="$(cd "$DIR" && pwd)"
PY="${GPU_CHECK_PYTHON:-$(command -v python3)}"
TORCH_LIB="$("$PY" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')"
export LD_LIBRARY_PATH="$DIR/deps:$DIR/lib:$TORCH_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
OPGUARD="$DIR/bin/opguard"
GPT="$DIR/bin/tiny_gpt"
WORK="$(mktemp -d)"
failed=0
step() { echo; echo "== $*"; }
check() {  # check NAME COMMAND...: runs it, prints PASS/FAIL with its exit status
  local name="$1"; shift
  if "$@"; then echo "PASS $name"; else echo "FAIL $name (exit $?)"; failed=1; fi
}
step_ms() { grep -o 'steps 1\.\.[0-9]* mean [0-9.]* ms' "$1" | awk '{print $4}'; }

step "machine"
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader 2>&1
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())'

CORPUS="--corpus $ROOT/examples/data/corpus.txt"  # tiny_gpt's built-in path is this machine's checkout
SMALL="--width 64 --depth 2 --seq 32 --batch 8 --steps 3 --print-every 1 $CORPUS"
step "record tiny_gpt on the GPU twice, diff"
check "record gpu 1" "$OPGUARD" record --out "$WORK/gpu1" -- "$GPT" $SMALL --device cuda > "$WORK/gpu1.log" 2>&1
check "record gpu 2" "$OPGUARD" record --out "$WORK/gpu2" -- "$GPT" $SMALL --device cuda > "$WORK/gpu2.log" 2>&1
if grep -q "copied to the host" "$WORK/gpu1.log"; then echo "FAIL CUDA tensors were hashed on the host"; failed=1; fi
tail -4 "$WORK/gpu1.log"
"$OPGUARD" ls "$WORK/gpu1" 2>&1 | head -12
"$OPGUARD" diff "$WORK/gpu1" "$WORK/gpu2" 2>&1 | head -30
echo "(diff exit status ${PIPESTATUS[0]})"

step "the same model on the CPU, diff CPU against GPU"
check "record cpu" "$OPGUARD" record --out "$WORK/cpu" -- "$GPT" $SMALL --threads 4 > "$WORK/cpu.log" 2>&1
"$OPGUARD" diff "$WORK/cpu" "$WORK/gpu1" 2>&1 | head -40
echo "(diff exit status ${PIPESTATUS[0]})"

SIZE="--width 512 --depth 8 --seq 256 --batch 16 --steps 12 --print-every 0 $CORPUS"
step "step times on the GPU: $SIZE"
mkdir -p "$DIR/nomodule/bin" "$DIR/nomodule/lib"
cp "$OPGUARD" "$DIR/nomodule/bin/" && cp "$DIR/lib/libopguard_record.so" "$DIR/nomodule/lib/"
ln -sfn "$DIR/python" "$DIR/nomodule/python"
for i in 1 2 3; do
  "$GPT" $SIZE --device cuda > /dev/null 2> "$WORK/plain$i.log"
  "$OPGUARD" record --out "$WORK/big$i" -- "$GPT" $SIZE --device cuda > /dev/null 2> "$WORK/dev$i.log"
  "$DIR/nomodule/bin/opguard" record --out "$WORK/host$i" -- "$GPT" $SIZE --device cuda > /dev/null 2> "$WORK/host$i.log"
  echo "run $i: unrecorded $(step_ms "$WORK/plain$i.log") ms, recorded (device hashing) $(step_ms "$WORK/dev$i.log") ms," \
       "recorded (host copies) $(step_ms "$WORK/host$i.log") ms"
  rm -rf "$WORK/big$i" "$WORK/host$i"
done
grep -h "copied to the host" "$WORK/host1.log" | head -1

step "record tiny_gpt.py on the GPU"
check "record python gpu" "$OPGUARD" record --out "$WORK/py" -- "$PY" "$ROOT/examples/tiny_gpt.py" $SMALL --device cuda \
  > "$WORK/py.log" 2>&1
if grep -q "copied to the host" "$WORK/py.log"; then echo "FAIL CUDA tensors were hashed on the host"; failed=1; fi
tail -3 "$WORK/py.log"
"$OPGUARD" ls "$WORK/py" 2>&1 | head -8

step "non_blocking copies to pinned host memory, recorded twice: the same fingerprints"
# Never run on a GPU before (2026-12-05): the recorder waits for the device's
# stream before it hashes the host output of an op with a CUDA input; without
# that it hashed the bytes before the copy landed.
cat > "$WORK/d2h.py" <<'PYEOF'
import torch
torch.manual_seed(0)
x = torch.randn(2048, 2048, device="cuda")
for i in range(4):
    y = (x @ x.T).relu() * (i + 1)  # keeps the stream busy: the copy lands late
    h = torch.empty(y.shape, pin_memory=True)
    h.copy_(y, non_blocking=True)
    torch.cuda.synchronize()
    print(h.sum().item())
PYEOF
check "record d2h 1" "$OPGUARD" record --out "$WORK/d2h1" -- "$PY" "$WORK/d2h.py" > "$WORK/d2h1.log" 2>&1
check "record d2h 2" "$OPGUARD" record --out "$WORK/d2h2" -- "$PY" "$WORK/d2h.py" > "$WORK/d2h2.log" 2>&1
check "d2h recordings agree" "$OPGUARD" diff "$WORK/d2h1" "$WORK/d2h2"

step "replay of recorded CPU events on the GPU (device=cuda:0)"
# Never run on a GPU before: every event of one CPU step replayed on the device,
# and the same step replayed on the CPU for comparison (exit 3 = some differ).
check "record cpu, dump all" "$OPGUARD" record --dump-all --out "$WORK/full" -- "$GPT" \
  --width 64 --depth 2 --seq 32 --batch 8 --steps 1 --print-every 0 $CORPUS > "$WORK/full.log" 2>&1
"$OPGUARD" replay "$WORK/full" --all --config device=cuda:0 2>&1 | tail -12
echo "(replay on cuda:0 exit status ${PIPESTATUS[0]})"
"$OPGUARD" replay "$WORK/full" --all 2>&1 | tail -4
echo "(replay on the CPU exit status ${PIPESTATUS[0]})"

rm -rf "$WORK"
echo
[ $failed -eq 0 ] && echo "gpu_record_check: all checks passed" || echo "gpu_record_check: some checks FAILED"
exit $failed
