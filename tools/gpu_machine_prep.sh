#!/usr/bin/env bash
# Prepare a GPU machine without network (the H200: CUDA 13 driver, torch cu130 with the CUDA 13.0 and cuDNN 9.19
# pip libraries, Python 3.12, NumPy 2) for tools/gpu_check.py with the project's own MXNet build (docs/gpu.md:
# plan, sizes, budget). Only MXNet travels: it links the CUDA libraries that image already has.
#
#   here:   tools/gpu_machine_prep.sh fetch
#       packs the mxnet-local-gpu Python package (the stock CPU wheel's mxnet/ with libmxnet.so replaced by
#       MXNET_GPU_BUILD/install/libmxnet.so, from make mxnet-gpu) and the GPU operator library built against
#       CUDA 13 (make ops-cuda-check) into one xz tarball, split into pieces of PIECE_MIB (60) MiB under
#       .whl/pieces (git-ignored) with SHA-256 sums. MXNET_LIB=FILE packs another libmxnet.so (a rehearsal).
#   here:   tools/gpu_machine_prep.sh calls
#       prints the pieces grouped into device calls of at most CALL_MIB (62) MiB each: one call per line.
#   there:  tools/gpu_machine_prep.sh install
#       reassembles and verifies the tarball, unpacks it into $SITE (default /tmp/sniper_site), puts the GPU
#       operator library in place, installs the NumPy 2 compatibility layer into that Python's user site-packages
#       (tools/numpy2_compat: every process of that Python gets it, no PYTHONPATH) and builds the Cython
#       extensions for that Python.
#   there:  tools/gpu_machine_prep.sh check [gpu_check.py options]
#       runs tools/gpu_check.py with the package and the CUDA 13 libraries of the Python's nvidia/ packages on
#       PYTHONPATH and LD_LIBRARY_PATH.
#   there:  tools/gpu_machine_prep.sh device
#       the last device call's command: install, then check under CHECK_SECONDS (480: with the install, within
#       one device call's 600 s), report to $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."

PACK=.whl/pack
PIECES=${PIECES:-.whl/pieces}  # tools/onnx_gpu_prep.sh groups its own pieces with "calls"
PIECE_MIB=${PIECE_MIB:-60}
CALL_MIB=${CALL_MIB:-62}
SITE=${SITE:-/tmp/sniper_site}
PYTHON=${PYTHON:-python3}
MXNET_GPU_BUILD=${MXNET_GPU_BUILD:-build/mxnet-gpu}
TARBALL=mxnet-local-gpu.tar.xz
OPS_LIBRARY=libsniper_ops_cuda.so  # inside the tarball, beside mxnet/
# shellcheck source=mxnet_gpu/versions.sh
. tools/mxnet_gpu/versions.sh

fetch() {
  local lib=${MXNET_LIB:-$MXNET_GPU_BUILD/install/libmxnet.so} start=$SECONDS stage=.whl/stage
  [ -f "$lib" ] || { echo "error: no $lib: build it with make mxnet-gpu MXNET_SRC=DIR (or give MXNET_LIB=FILE)" >&2; exit 1; }
  rm -rf "$stage" "$PACK" "$PIECES" && mkdir -p "$stage" "$PACK" "$PIECES" .whl/wheels
  "$PYTHON" -m pip download -q --no-deps --disable-pip-version-check -d .whl/wheels "$MXNET_CPU_WHEEL" \
    2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
  "$PYTHON" -m zipfile -e .whl/wheels/mxnet-1.9.1-*.whl "$stage"
  cp "$lib" "$stage/mxnet/libmxnet.so"
  make -s ops-cuda-check
  cp build/cuda13/libsniper_ops_cuda.so "$stage/$OPS_LIBRARY"
  echo "packing $(du -sh "$stage" | cut -f1) with xz"
  tar -C "$stage" -cf - . | nice xz -6 -T "${XZ_THREADS:-2}" > "$PACK/$TARBALL"
  split -b "${PIECE_MIB}M" -d -a 2 "$PACK/$TARBALL" "$PIECES/$TARBALL.part-"
  (cd "$PACK" && sha256sum -- "$TARBALL") > "$PIECES/SHA256SUMS"
  rm -rf "$stage"
  du -b "$lib" "$PACK/$TARBALL"
  echo "$(ls "$PIECES" | wc -l) files in $PIECES in $((SECONDS - start)) s; device calls: $(calls | wc -l) (tools/gpu_machine_prep.sh calls)"
}

calls() {  # first-fit groups of pieces under CALL_MIB, largest first: the carry list of each device call
  "$PYTHON" - "$PIECES" "$CALL_MIB" <<'PY'
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
PY
}

install() {
  [ -f "$PIECES/SHA256SUMS" ] || { echo "no $PIECES/SHA256SUMS: carry the pieces first (tools/gpu_machine_prep.sh calls)"; exit 1; }
  local start=$SECONDS
  mkdir -p "$PACK" "$SITE"
  cat "$PIECES/$TARBALL".part-* > "$PACK/$TARBALL"
  (cd "$PACK" && sha256sum --quiet -c "../pieces/SHA256SUMS")
  # Python's lzma and tarfile, not the xz tool, which an image may lack; only plain files and folders
  "$PYTHON" -c 'import sys, tarfile; tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2], filter="data")' \
    "$PACK/$TARBALL" "$SITE"
  cp "$SITE/$OPS_LIBRARY" lib/ops/libsniper_ops.so  # the GPU variant: CPU and GPU forward
  local user_site
  user_site=$("$PYTHON" -m site --user-site)
  mkdir -p "$user_site"
  "$PYTHON" tools/numpy2_compat/sniper_numpy2_compat.py "$user_site"  # MXNet 1.9.1 under the image's NumPy 2
  echo "installed into $SITE in $((SECONDS - start)) s"
  start=$SECONDS
  environment
  "$PYTHON" setup.py -q build_ext --inplace -j "$(nproc)"
  echo "built the extensions in $((SECONDS - start)) s"
}

environment() {  # the package and the CUDA 13 libraries it links
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
  local libs
  # pip's CUDA 13 wheels (torch's on the GPU image) keep them in nvidia/cu13/lib and nvidia/cudnn/lib
  libs=$("$PYTHON" -c 'import os, nvidia; print(":".join(d for b in nvidia.__path__ for d in
         (os.path.join(b, "cu13", "lib"), os.path.join(b, "cudnn", "lib")) if os.path.isdir(d)))' 2>/dev/null || true)
  # on the build machine, the toolchain's (a CPU machine also needs its driver stub to load the library)
  local toolchain=$MXNET_GPU_BUILD/toolchain/cuda/nvidia
  [ ! -d "$toolchain/cu13/lib" ] || toolchain=$(cd "$toolchain" && pwd)
  [ -n "$libs" ] || [ ! -d "$toolchain/cu13/lib" ] || libs="$toolchain/cu13/lib:$toolchain/cudnn/lib"
  # a machine without the driver (a CPU rehearsal) loads the library against the toolchain's stub, which
  # answers "no device"; never on a GPU machine, whose ldconfig knows libcuda.so.1
  if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 ' && [ -d "$toolchain/cu13/lib/stubs" ]; then
    libs="${libs:+$libs:}$toolchain/cu13/lib/stubs"
  fi
  export LD_LIBRARY_PATH="${libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export CUDA_CACHE_MAXSIZE=4294967296  # room for the driver's PTX JIT cache, should any PTX be compiled
  export CUDA_MODULE_LOADING=LAZY  # CUDA >= 11.7 loads a kernel when first used
}

case "${1:-}" in
  fetch) fetch ;;
  calls) calls ;;
  install) install ;;
  check) shift; environment; exec "$PYTHON" tools/gpu_check.py "$@" ;;
  device)
    out=${OUT:-output/gpu_check}
    mkdir -p "$out"
    install 2>&1 | tee "$out/install.log"
    environment
    # the budget stops the runs in time for the report; timeout is the safety net
    timeout "${CHECK_SECONDS:-480}" "$PYTHON" tools/gpu_check.py --out "$out/gpu_check.json" \
      --workdir /tmp/gpu_check --budget "$(( ${CHECK_SECONDS:-480} - 20 ))" | tee "$out/gpu_check.md" ;;
  *) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0"; exit 2 ;;
esac
