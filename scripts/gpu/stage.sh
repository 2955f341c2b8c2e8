#!/usr/bin/env bash
# Stage ONNX Runtime's CUDA build (onnxruntime-gpu, CUDA 13) for a GPU machine reached through a
# 64 MiB-per-call channel: the whole `onnxruntime` Python package (its C library for layerwise, its
# Python module for the probes of scripts/gpu/probes.py), xz-compressed, in parts under .gpu/pN.
# On the GPU machine, after copying every part to /tmp/ortgpu: `source scripts/gpu/unstage.sh`.
set -euo pipefail
version=${ORT_GPU_VERSION:-1.31.1}
root=$(git rev-parse --show-toplevel)
stage="$root/.gpu"
exclude=$(git -C "$root" rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >> "$exclude"
rm -rf "$stage"/p[0-9]* "$stage/wheel" "$stage/pkg" && mkdir -p "$stage/wheel" "$stage/pkg"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 -d "$stage/wheel" "onnxruntime-gpu==$version"
unzip -q -o "$stage"/wheel/*.whl 'onnxruntime/*' -x 'onnxruntime/transformers/*' 'onnxruntime/quantization/*' \
  'onnxruntime/capi/libonnxruntime_providers_tensorrt.so' -d "$stage/pkg"
tar -cf - -C "$stage/pkg" onnxruntime | xz -6 -T0 > "$stage/ort-gpu.tar.xz"
# Parts of 40 MB leave room for the working tree (about 20 MB) within the 64 MiB a call carries.
(cd "$stage" && split -b 40000000 -d ort-gpu.tar.xz part.)
n=0
for p in "$stage"/part.*; do n=$((n+1)); mkdir -p "$stage/p$n"; mv "$p" "$stage/p$n/"; done
rm -rf "$stage/wheel" "$stage/pkg" "$stage/ort-gpu.tar.xz"
echo "staged onnxruntime-gpu $version in $n parts under .gpu/p1..p$n"
