#!/usr/bin/env bash
# Make an MXNet 1.9.1 source tree (what `git clone --recursive -b 1.9.1` gives, minus what this build never
# reads) from bare git mirrors: apache/mxnet and the submodules the build compiles, each from its own mirror.
#
#   tools/mxnet_gpu/make_source.sh DEST [MIRRORS]
#
# MIRRORS (default /work/.mirror) holds OWNER+NAME/repo bare repositories: apache+mxnet, dmlc+dmlc-core,
# dmlc+dlpack, apache+tvm and google+googletest, each holding the commit MXNet 1.9.1 pins (its gitlinks).
# A mirror may lack large blobs (then `git archive` of the whole tree fails, and even a path-limited one
# complains about them), so MXNet is archived subtree by subtree: the ones CMake reads with oneDNN, intgemm,
# ps-lite, ONNX-TensorRT and the bundled OpenMP off.
set -euo pipefail
DEST=${1:?usage: make_source.sh DEST [MIRRORS]}
MIRRORS=${2:-/work/.mirror}
TAG=1.9.1
MXNET_GIT=$MIRRORS/apache+mxnet/repo
[ ! -e "$DEST" ] || { echo "error: $DEST exists; give a new folder" >&2; exit 1; }
git -C "$MXNET_GIT" rev-parse -q --verify "$TAG^{commit}" >/dev/null \
  || { echo "error: $MXNET_GIT has no tag $TAG" >&2; exit 1; }
rm -rf "$DEST.partial" && mkdir -p "$DEST.partial"  # what an interrupted run left
for file in CMakeLists.txt LICENSE NOTICE Makefile; do git -C "$MXNET_GIT" show "$TAG:$file" > "$DEST.partial/$file"; done
# CMake also builds example/extensions (customop_lib ...)
for dir in cmake include src 3rdparty python plugin tools config contrib make example/extensions; do
  git -C "$MXNET_GIT" archive --prefix="$dir/" "$TAG:$dir" | tar -x -C "$DEST.partial"
done
# CMake always adds tests/: a stub is enough.
mkdir -p "$DEST.partial/tests" && echo "# tests are not built here" > "$DEST.partial/tests/CMakeLists.txt"
# Submodules at the commits MXNet pins; tvm contributes only nnvm (compiled into libmxnet) and its headers.
for sub in dmlc+dmlc-core:3rdparty/dmlc-core dmlc+dlpack:3rdparty/dlpack google+googletest:3rdparty/googletest \
           "apache+tvm:3rdparty/tvm:nnvm include"; do
  IFS=: read -r mirror path dirs <<<"$sub"
  commit=$(git -C "$MXNET_GIT" ls-tree "$TAG" "$path" | awk '$2 == "commit" {print $3}')
  [ -n "$commit" ] || { echo "error: $path is not a submodule of mxnet $TAG" >&2; exit 1; }
  mkdir -p "$DEST.partial/$path"
  # shellcheck disable=SC2086
  git -C "$MIRRORS/$mirror/repo" archive "$commit" $dirs | tar -x -C "$DEST.partial/$path" \
    || { echo "error: $MIRRORS/$mirror/repo lacks commit $commit of $path" >&2; exit 1; }
done
# include/mkldnn/* link into the absent oneDNN submodule; CMake stops on dangling sources.
find "$DEST.partial/include" -xtype l -delete
mv "$DEST.partial" "$DEST"
echo "MXNet $TAG source tree in $DEST ($(du -sh "$DEST" | cut -f1))"
