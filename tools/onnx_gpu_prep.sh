#!/usr/bin/env bash
# The ONNX Runtime GPU figure on a device machine without network (the H200: CUDA 13 driver and pip libraries
# with its PyTorch, Python 3.12, NumPy 2): images/s of the three-scale test of ResNet-101 (random weights made
# there from a seed), float32 and float16, end to end (with the host pipeline) and in the network alone
# (tools/onnx_gpu/device_run.py). Only the onnxruntime-gpu 1.31.1 wheel (built for CUDA 13) and the weightless
# models (tools/onnx_gpu_model.py: float32 and float16) travel, in pieces of PIECE_MIB.
#
#   here:   tools/onnx_gpu_prep.sh fetch     the wheels (onnxruntime-gpu, flatbuffers, protobuf for cp312) and
#           tools/onnx_gpu_model.py's folder (CFG, default ResNet-101) in one tar, split into .whl/onnx_gpu/pieces
#   here:   tools/onnx_gpu_prep.sh calls     the pieces grouped into device calls (tools/gpu_machine_prep.sh calls)
#   there:  tools/onnx_gpu_prep.sh device    reassemble, install into $SITE, build the extensions, time within
#           RUN_SECONDS (240: with install and build one call of about 5 minutes, so that a rerun fits in 15
#           minutes of device time), results in $OUT/onnx_gpu.json (written after each precision)
#   here:   tools/onnx_gpu_prep.sh rehearse  the device steps here on the CPU provider (CFG default: the tiny
#           network, so that it takes minutes), with this venv's onnxruntime instead of the wheel
#   here:   tools/onnx_gpu_prep.sh rehearse-model   the same without the wheels (no network): the models only
set -euo pipefail
cd "$(dirname "$0")/.."

ROOT_DIR=.whl/onnx_gpu
PIECES=$ROOT_DIR/pieces
PIECE_MIB=${PIECE_MIB:-60}
SITE=${SITE:-/tmp/sniper_onnx_site}
PYTHON=${PYTHON:-python3}
TARBALL=onnx_gpu.tar
WHEELS=("onnxruntime-gpu==1.31.1" "flatbuffers==25.12.19" "protobuf==7.36.2")

fetch() {  # $1: "no-wheels" to leave the wheels out (rehearse-model)
  local cfg=${CFG:-configs/faster/sniper_res101_e2e.yml} stage=$ROOT_DIR/stage
  rm -rf "$stage" "$PIECES" && mkdir -p "$stage/wheels" "$PIECES"
  [ "${1:-}" = no-wheels ] || .venv/bin/python -m pip download -q --no-deps --disable-pip-version-check \
    --python-version 3.12 --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --only-binary=:all: \
    -d "$stage/wheels" "${WHEELS[@]}"
  .venv/bin/python tools/onnx_gpu_model.py --cfg "$cfg" --out "$stage/model"
  tar -C "$stage" -cf "$ROOT_DIR/$TARBALL" wheels model
  split -b "${PIECE_MIB}M" -d -a 2 "$ROOT_DIR/$TARBALL" "$PIECES/$TARBALL.part-"
  (cd "$ROOT_DIR" && sha256sum -- "$TARBALL") > "$PIECES/SHA256SUMS"
  rm -rf "$stage" "${ROOT_DIR:?}/$TARBALL"
  local calls
  calls=$(PIECES=$PIECES tools/gpu_machine_prep.sh calls | wc -l)
  echo "$(ls "$PIECES" | wc -l) files in $PIECES; device calls: $calls"
}

unpack() {  # the tarball's wheels and model into $ROOT_DIR/unpacked
  [ -f "$PIECES/SHA256SUMS" ] || {
    echo "no $PIECES/SHA256SUMS: carry the pieces first (tools/onnx_gpu_prep.sh calls)"; exit 1; }
  cat "$PIECES/$TARBALL".part-* > "$ROOT_DIR/$TARBALL"
  (cd "$ROOT_DIR" && sha256sum --quiet -c pieces/SHA256SUMS)
  rm -rf "$ROOT_DIR/unpacked" && mkdir -p "$ROOT_DIR/unpacked"
  tar -C "$ROOT_DIR/unpacked" -xf "$ROOT_DIR/$TARBALL"
  rm -f "${ROOT_DIR:?}/$TARBALL"
}

run() {  # $1: provider; the model folders in $ROOT_DIR/unpacked/model
  local out=${OUT:-output/onnx_gpu} seconds=${RUN_SECONDS:-240}
  mkdir -p "$out"
  timeout "$seconds" "$PYTHON" tools/onnx_gpu/device_run.py --model "$ROOT_DIR/unpacked/model" --provider "$1" \
    --seconds "$(( seconds * 3 / 4 ))" --out "$out/onnx_gpu.json" ${IMAGES:+--images "$IMAGES"} \
    ${IMAGE_SIZE:+--image_size $IMAGE_SIZE}
}

case "${1:-}" in
  fetch) fetch ;;
  calls) PIECES=$PIECES tools/gpu_machine_prep.sh calls ;;
  device)
    start=$SECONDS
    unpack
    "$PYTHON" -m pip install -q --no-deps --disable-pip-version-check --target "$SITE" "$ROOT_DIR"/unpacked/wheels/*.whl
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
    "$PYTHON" setup.py -q build_ext --inplace -j "$(nproc)"
    echo "installed and built in $((SECONDS - start)) s"
    run cuda ;;
  rehearse|rehearse-model)
    CFG=${CFG:-configs/faster/sniper_synthetic_tiny.yml} fetch "$([ "$1" = rehearse-model ] && echo no-wheels)"
    unpack
    PYTHON=.venv/bin/python IMAGES=${IMAGES:-2} RUN_SECONDS=${RUN_SECONDS:-600} run cpu ;;
  *) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0"; exit 2 ;;
esac
