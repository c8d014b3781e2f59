#!/usr/bin/env bash
# One command for a fresh Debian 12 machine (as root):
#   ./setup.sh demo   install what is missing, build, run the demo
#   ./setup.sh test   install what is missing, build, run the whole test suite
# Idempotent: a second run installs nothing and rebuilds only what changed.
set -euo pipefail
cd "$(dirname "$0")"
MODE="${1:-demo}"
ROOT="$PWD"
BUILD="${OPGUARD_BUILD_DIR:-$ROOT/build}"
VENV="$ROOT/.venv"
TORCH_VERSION=2.11.0

APT_PACKAGES="build-essential cmake ninja-build pkg-config git python3 python3-venv \
  libhdf5-dev hdf5-tools libcli11-dev libfmt-dev doctest-dev libxxhash-dev nlohmann-json3-dev \
  clang-14 libclang-rt-14-dev"
missing=""
for p in $APT_PACKAGES; do
  dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "setup: installing Debian packages:$missing"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq $missing >/dev/null
fi

# PyTorch provides libtorch (headers, libraries, CMake config) and the Python
# side; h5py reads recordings in the tests.
if ! "$VENV/bin/python" -c "import torch, h5py, numpy; assert torch.__version__.split('+')[0] == '$TORCH_VERSION'" 2>/dev/null; then
  echo "setup: creating $VENV with torch $TORCH_VERSION (several GB; pip's cache makes reruns fast)"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install -q "torch==$TORCH_VERSION" h5py numpy
fi
TORCH_PREFIX="$("$VENV/bin/python" -c 'import torch; print(torch.utils.cmake_prefix_path)')"

CMAKE_ARGS=(-G Ninja -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" -DOPGUARD_PYTHON="$VENV/bin/python")
if [ "${CI:-}" = "true" ]; then CMAKE_ARGS+=(-DOPGUARD_WERROR=ON); fi
if [ ! -f "$BUILD/build.ninja" ]; then
  cmake -S "$ROOT" -B "$BUILD" "${CMAKE_ARGS[@]}" >/dev/null
fi
cmake --build "$BUILD" -j "$(nproc)"

case "$MODE" in
  demo)
    exec "$ROOT/examples/demo.sh" "$BUILD"
    ;;
  test)
    cd "$BUILD"
    exec ctest --output-on-failure -j 1
    ;;
  *)
    echo "usage: ./setup.sh demo|test" >&2
    exit 2
    ;;
esac
