# Sourced on the GPU machine once every staged part is in /tmp/ortgpu (scripts/gpu/stage.sh):
# unpacks ONNX Runtime's GPU package and points layerwise and Python at it.
if [ ! -e /tmp/ortgpu/onnxruntime/capi/libonnxruntime.so.1.31.1 ]; then
    (cd /tmp/ortgpu && cat part.* | xz -d | tar -xf -) || return 1
fi
NV=$(python3 -c 'import nvidia; print(list(nvidia.__path__)[0])')
export LD_LIBRARY_PATH=/tmp/ortgpu/onnxruntime/capi:$NV/cu13/lib:$NV/cudnn/lib:${LD_LIBRARY_PATH:-}
export PYTHONPATH=/tmp/ortgpu${PYTHONPATH:+:$PYTHONPATH}
export LAYERWISE_ORT_LIB=/tmp/ortgpu/onnxruntime/capi/libonnxruntime.so.1.31.1
