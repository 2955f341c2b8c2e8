#!/usr/bin/env bash
# Run on the lent GPU after the staging calls: each quantized file and the file fix wrote, on ONNX
# Runtime's CUDA provider against the float32 model on its CPU provider (worst output rel L2).
set -u
root=$(pwd)
NV=$(python3 -c 'import nvidia; print(list(nvidia.__path__)[0])')
export LD_LIBRARY_PATH=/tmp/ortgpu:$NV/cu13/lib:$NV/cudnn/lib:${LD_LIBRARY_PATH:-}
export LAYERWISE_ORT_LIB=/tmp/ortgpu/libonnxruntime.so.1.31.1
L=$root/.gpu/run/layerwise
mkdir -p "$OUT/r"
nvidia-smi --query-gpu=name --format=csv,noheader
run() {
  local name=$1 dir=$2 float=$3 cand=$4 inputs=$5
  ( cd "$dir" && timeout 200 "$L" bisect "$float" --ref ort:cpu --cand ort:cuda --cand-model "$cand" --inputs "$inputs" --json "$OUT/r/$name.json" > "$OUT/r/$name.txt" 2>&1 )
  local rc=$?
  python3 -c "
import json,sys
try:
  r=json.load(open('$OUT/r/$name.json')); o=[x for x in r['outputs'] if x['compared']]
  print('$name', 'exit $rc', r['verdict']['status'], ' '.join('%s=%.3e'%(x['name'],x['rel_l2_err']) for x in o))
except Exception as e: print('$name', 'exit $rc', 'no report', e)
"
}
M=${MODELS:-$root/.gpu/run/m}
for k in dyn qop qdq; do
  run cls_$k "$M" cls.onnx cls_$k.onnx cls_in.npz
  run cls_${k}_fixed "$M" cls.onnx cls_${k}_fixed.onnx cls_in.npz
done
run clsp_qop "$M" clsp.onnx clsp_qop.onnx clsp_in.npz
run clsp_qop_fixed "$M" clsp.onnx clsp_qop_fixed.onnx clsp_in.npz
if [ -d /tmp/m2 ]; then
  for k in dyn qop qdq; do run nsfw_$k /tmp/m2 nsfw.onnx nsfw_$k.onnx nsfw_in.npz; done
fi
