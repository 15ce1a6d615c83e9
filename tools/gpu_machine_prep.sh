#!/usr/bin/env bash
# Prepare a GPU machine that has no network for tools/gpu_check.py (docs/gpu.md: plan, sizes, budget).
#
#   here (network):  tools/gpu_machine_prep.sh fetch [--cuda-libs]
#       downloads, for CPython 3.12 on manylinux x86_64, mxnet-cu117 1.9.1 and the CUDA 11.7 runtime wheel
#       (and with --cuda-libs the CUDA 11 libraries libmxnet.so links: cuDNN 8, cuBLAS, cuFFT, cuRAND,
#       cuSOLVER, cuSPARSE, NCCL, NVRTC, NVTX, for a machine without CUDA 11 installed), builds the GPU
#       operator library (make ops-cuda-check), and splits everything into pieces of PIECE_MIB (60) MiB
#       under .whl/pieces (git-ignored), with SHA-256 sums.
#   here:            tools/gpu_machine_prep.sh calls
#       prints the pieces grouped into device calls of at most CALL_MIB (62) MiB each: one call per line.
#   there:           tools/gpu_machine_prep.sh install
#       reassembles and verifies the wheels, installs them with pip --target $SITE (default /tmp/sniper_site),
#       puts the GPU operator library in place and builds the Cython extensions for that Python.
#   there:           tools/gpu_machine_prep.sh check [gpu_check.py options]
#       runs tools/gpu_check.py with the numpy 2 shim, the installed packages and their CUDA libraries.
set -euo pipefail
cd "$(dirname "$0")/.."

WHEELS=.whl/wheels
PIECES=.whl/pieces
PIECE_MIB=${PIECE_MIB:-60}
CALL_MIB=${CALL_MIB:-62}
SITE=${SITE:-/tmp/sniper_site}
PYTHON=${PYTHON:-python3}
MXNET_WHEEL=mxnet-cu117==1.9.1
CUDA_RUNTIME=nvidia-cuda-runtime-cu11==11.7.99
# The CUDA 11.7-era releases of what libmxnet.so (mxnet-cu117 1.9.1) names in its NEEDED entries.
CUDA_LIBS="nvidia-cudnn-cu11==8.5.0.96 nvidia-cublas-cu11==11.10.3.66 nvidia-cufft-cu11==10.7.2.91
nvidia-curand-cu11==10.2.10.91 nvidia-cusolver-cu11==11.4.0.1 nvidia-cusparse-cu11==11.7.4.91
nvidia-nccl-cu11==2.14.3 nvidia-cuda-nvrtc-cu11==11.7.99 nvidia-nvtx-cu11==11.7.91"
OPS_LIBRARY=.whl/pieces/libsniper_ops_cuda.so

download() {  # pip download for the GPU machine's Python (3.12), not this one's
  "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$WHEELS" "$@"
}

fetch() {
  mkdir -p "$WHEELS" "$PIECES"
  local start=$SECONDS
  # shellcheck disable=SC2086
  download "$MXNET_WHEEL" "$CUDA_RUNTIME" $([ "${1:-}" = --cuda-libs ] && echo $CUDA_LIBS)
  echo "downloaded in $((SECONDS - start)) s"
  make -s ops-cuda-check
  rm -f "$PIECES"/*
  cp build/cuda/libsniper_ops_cuda.so "$OPS_LIBRARY"
  for wheel in "$WHEELS"/*.whl; do
    split -b "${PIECE_MIB}M" -d -a 2 "$wheel" "$PIECES/$(basename "$wheel").part-"
  done
  (cd "$WHEELS" && sha256sum -- *.whl) > "$PIECES/SHA256SUMS"
  du -b "$WHEELS"/*.whl | sort -n
  echo "$(ls "$PIECES" | wc -l) files in $PIECES; device calls: $(calls | wc -l) (tools/gpu_machine_prep.sh calls)"
}

calls() {  # first-fit groups of pieces under CALL_MIB, largest first: the carry list of each device call
  "$PYTHON" - "$PIECES" "$CALL_MIB" <<'EOF'
import os, sys
folder, limit = sys.argv[1], int(sys.argv[2]) * 2 ** 20
sizes = sorted(((os.path.getsize(os.path.join(folder, n)), n) for n in os.listdir(folder)), reverse=True)
groups = []
for size, name in sizes:
    for group in groups:
        if group[0] + size <= limit and len(group[1]) < 8:
            group[0] += size
            group[1].append(name)
            break
    else:
        groups.append([size, [name]])
for total, names in groups:
    print(f"{total / 2 ** 20:6.1f} MiB  " + " ".join(os.path.join(folder, n) for n in names))
EOF
}

install() {
  [ -f "$PIECES/SHA256SUMS" ] || { echo "no $PIECES/SHA256SUMS: carry the pieces first (tools/gpu_machine_prep.sh calls)"; exit 1; }
  mkdir -p "$WHEELS"
  local start=$SECONDS wheel
  for wheel in $(awk '{print $2}' "$PIECES/SHA256SUMS"); do
    cat "$PIECES/$wheel".part-* > "$WHEELS/$wheel"
  done
  (cd "$WHEELS" && sha256sum --quiet -c "../pieces/SHA256SUMS")
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHEELS"/*.whl
  echo "installed into $SITE in $((SECONDS - start)) s"
  cp "$OPS_LIBRARY" lib/ops/libsniper_ops.so  # the GPU variant: CPU and GPU forward
  start=$SECONDS
  environment
  "$PYTHON" setup.py -q build_ext --inplace -j "$(nproc)"
  echo "built the extensions in $((SECONDS - start)) s"
}

environment() {  # the installed packages, their CUDA 11 libraries and the numpy 2 shim
  export PYTHONPATH="$PWD/tools/numpy2_compat:$SITE${PYTHONPATH:+:$PYTHONPATH}"
  local libs
  libs=$(find "$SITE/nvidia" -maxdepth 2 -name lib -type d 2>/dev/null | paste -sd: -)
  export LD_LIBRARY_PATH="${libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export CUDA_CACHE_MAXSIZE=4294967296  # room for the driver's PTX JIT cache, should any PTX be compiled
  export CUDA_MODULE_LOADING=LAZY  # CUDA >= 11.7 loads (and JIT-compiles) a kernel when first used
}

case "${1:-}" in
  fetch) shift; fetch "$@" ;;
  calls) calls ;;
  install) install ;;
  check) shift; environment; exec "$PYTHON" tools/gpu_check.py "$@" ;;
  *) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0"; exit 2 ;;
esac
