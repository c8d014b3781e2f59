#!/usr/bin/env bash
# Every GPU check in one go, on a machine with a GPU (docs/KERNELS.md):
#   1. builds the CUDA paths: opguard_kernels with cuda.cu, the kernels test
#      with its GPU cases, the NCCL replay test, the fingerprint benchmark;
#   2. runs them: CPU vs GPU fingerprint agreement (every dtype, odd sizes,
#      empty, strided), CPU vs GPU comparison agreement, the NCCL all-reduce
#      replay (needs 2 GPUs, else it says SKIPPED), replay of recorded CPU
#      events on the GPU (CMake build only), and CPU and CUDA
#      fingerprint / comparison throughput against memcpy, XXH3 and a
#      device-to-device copy.
# Whole run bounded by GPU_CHECK_TIMEOUT seconds (default 540, about 10 min).
#
# Usage (repository root):
#   benchmarks/gpu_check.sh [BUILD_DIR]            default build-gpu
#   benchmarks/gpu_check.sh --prepare DEPS_DIR     on a machine with the Debian
#       -dev packages: copy the headers and the xxhash library the direct build
#       needs (xxhash, doctest) into DEPS_DIR, to carry to a GPU machine
#       that has nvcc but no Debian -dev packages.
#
# Build: with CMake when the full configure works there (HDF5, CLI11, fmt,
# doctest installed); otherwise a direct nvcc/g++ build of only the torch-free,
# HDF5-free GPU targets, taking headers from $GPU_CHECK_DEPS (see --prepare).
# GPU_CHECK_DIRECT=1 skips the CMake attempt.
# Exit status: 0 when every check passed, 1 when one failed, 124 on timeout.
set -u
ROOT="$(cd "$(dirname "$0")/.." && pwd)"

if [ "${1:-}" = "--prepare" ]; then
  DEPS="${2:?--prepare needs a directory}"
  mkdir -p "$DEPS/include/doctest" "$DEPS/lib"
  cp /usr/include/xxhash.h /usr/include/xxh3.h /usr/include/xxh_x86dispatch.h "$DEPS/include/"
  cp /usr/include/doctest/doctest.h "$DEPS/include/doctest/"
  # The shared library: fingerprint.cpp uses its runtime-dispatched XXH3,
  # which the static archive lacks.
  cp -L /usr/lib/x86_64-linux-gnu/libxxhash.so.0 "$DEPS/lib/"
  ln -sf libxxhash.so.0 "$DEPS/lib/libxxhash.so"
  echo "gpu_check: dependencies for the direct build in $DEPS (set GPU_CHECK_DEPS=$DEPS there)"
  exit 0
fi

if [ -z "${GPU_CHECK_INNER:-}" ]; then
  export GPU_CHECK_INNER=1
  timeout "${GPU_CHECK_TIMEOUT:-540}" "$0" "$@"
  rc=$?
  [ $rc -eq 124 ] && echo "gpu_check: TIMED OUT after ${GPU_CHECK_TIMEOUT:-540} s"
  exit $rc
fi

BUILD="${1:-$ROOT/build-gpu}"
mkdir -p "$BUILD"
CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
NVCC="${NVCC:-$CUDA_HOME/bin/nvcc}"
ARCH="${GPU_CHECK_ARCH:-90}"
JOBS="$(nproc)"
failed=0
step() { echo; echo "== $*"; }

step "machine"
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader 2>&1 || echo "nvidia-smi failed"
"$NVCC" --version | tail -2
PY="${GPU_CHECK_PYTHON:-$(command -v python3)}"
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())' 2>&1

BIN=""
step "build (CMake)"
TORCH_PREFIX="$("$PY" -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null || true)"
if [ -z "${GPU_CHECK_DIRECT:-}" ] && cmake -S "$ROOT" -B "$BUILD/cmake" -G Ninja -DOPGUARD_CUDA=ON -DOPGUARD_NCCL=AUTO \
     -DOPGUARD_CUDA_ARCHITECTURES="$ARCH" -DCMAKE_CUDA_COMPILER="$NVCC" \
     ${TORCH_PREFIX:+-DCMAKE_PREFIX_PATH="$TORCH_PREFIX"} -DOPGUARD_PYTHON="$PY" > "$BUILD/cmake.log" 2>&1; then
  if ninja -C "$BUILD/cmake" -j "$JOBS" opguard_kernels_test opguard_nccl_test opguard_fingerprint_throughput \
       > "$BUILD/ninja.log" 2>&1; then
    BIN="$BUILD/cmake/bin"
    # Replay on the GPU needs the torch build (opguard, tiny_gpt, the replay test): a few minutes more.
    step "build (CMake): replay on the GPU"
    ninja -C "$BUILD/cmake" -j "$JOBS" opguard_replay_test > "$BUILD/ninja-replay.log" 2>&1 ||
      tail -30 "$BUILD/ninja-replay.log"
  else
    tail -30 "$BUILD/ninja.log"
  fi
elif [ -n "${GPU_CHECK_DIRECT:-}" ]; then
  echo "skipped (GPU_CHECK_DIRECT set)"
else
  echo "configure failed (last lines of $BUILD/cmake.log below); using the direct build"
  tail -5 "$BUILD/cmake.log"
fi

if [ -z "$BIN" ]; then
  step "build (direct nvcc/g++; GPU targets only)"
  DEPS="${GPU_CHECK_DEPS:-$ROOT/shared/gpu_deps}"
  D="$BUILD/direct"
  mkdir -p "$D"
  INC=(-I"$ROOT/core/include" -I"$ROOT/kernels/include" -I"$ROOT/kernels" -I"$DEPS/include" -I"$CUDA_HOME/include")
  XXLIB=(-L"$DEPS/lib" -lxxhash -Wl,-rpath,"$DEPS/lib")
  CXX=(g++ -std=c++17 -O3 -march=native -pthread "${INC[@]}")
  set -x
  "$NVCC" -std=c++17 -O3 -arch=sm_"$ARCH" --expt-relaxed-constexpr "${INC[@]}" -c "$ROOT/kernels/cuda.cu" -o "$D/cuda.o" &
  for f in core/dtype.cpp core/error.cpp kernels/fingerprint.cpp kernels/compare.cpp kernels/cuda_reference.cpp \
           kernels/decompose.cpp; do
    "${CXX[@]}" -c "$ROOT/$f" -o "$D/$(basename "$f" .cpp).o" &
  done
  "${CXX[@]}" -c "$ROOT/kernels/nccl.cpp" -o "$D/nccl.o" &
  wait
  LIBS=("$D"/dtype.o "$D"/error.o "$D"/fingerprint.o "$D"/compare.o "$D"/cuda_reference.o "$D"/decompose.o)
  CUDALIBS=(-L"$CUDA_HOME/lib64" -lcudart -Wl,-rpath,"$CUDA_HOME/lib64")
  mkdir -p "$D/bin"
  "${CXX[@]}" -DOPGUARD_TEST_CUDA "$ROOT"/tests/kernels/{fingerprint,compare,cuda,decompose}_test.cpp "$D/cuda.o" \
    "${LIBS[@]}" "${XXLIB[@]}" "${CUDALIBS[@]}" -o "$D/bin/opguard_kernels_test" &
  "${CXX[@]}" "$ROOT/tests/kernels/nccl_test.cpp" "$D/nccl.o" "${LIBS[@]}" "${XXLIB[@]}" "${CUDALIBS[@]}" -lnccl \
    -o "$D/bin/opguard_nccl_test" &
  "${CXX[@]}" -DOPGUARD_BENCH_CUDA "$ROOT/benchmarks/fingerprint_throughput.cpp" "$D/cuda.o" "${LIBS[@]}" "${XXLIB[@]}" \
    "${CUDALIBS[@]}" -o "$D/bin/opguard_fingerprint_throughput" &
  wait
  set +x
  BIN="$D/bin"
fi

run_check() {
  local name="$1"; shift
  step "$name: $*"
  if "$@"; then echo "-- $name: ok"; else echo "-- $name: FAILED (exit $?)"; failed=1; fi
}
for t in opguard_kernels_test opguard_nccl_test opguard_fingerprint_throughput; do
  [ -x "$BIN/$t" ] || { echo "gpu_check: $BIN/$t was not built"; failed=1; }
done
# SKIPPED lines and the NCCL per-ALGO/PROTO figures go to the output either way.
run_check "kernels (CPU vs GPU fingerprint and comparison)" "$BIN/opguard_kernels_test" -tc='*CUDA*,*cuda*,*GPU*,*gpu*'
run_check "kernels (all cases)" "$BIN/opguard_kernels_test"
run_check "NCCL all-reduce replay" "$BIN/opguard_nccl_test"
run_check "fingerprint throughput (CPU and CUDA)" "$BIN/opguard_fingerprint_throughput" --mib 1024 --repeats 5
if [ -x "$BIN/opguard_replay_test" ]; then
  run_check "replay of recorded CPU events on the GPU (device=cuda:0, tf32_cublas)" "$BIN/opguard_replay_test" -s \
    -tc='*device=cuda*,*config strings*,*opguard configs*'
else
  echo "-- replay on the GPU: not run (the direct build has no torch targets; it needs the CMake build)"
fi
[ $failed -eq 0 ] && echo "gpu_check: all checks passed" || echo "gpu_check: SOME CHECKS FAILED"
exit $failed
