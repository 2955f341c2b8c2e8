#!/usr/bin/env bash
# The kept LayerNorm on CUDA (issue "Right at the edges", item 6): a generated decoder of 400
# pre-LayerNorm blocks with gamma and beta (12,801 nodes; the residual grows at block 397 until
# its LayerNorms' squared deviations exceed FP16's range) is converted to FP16 by layerwise and
# bisected on ONNX Runtime's CUDA provider against CUDA float32 (TF32 off): the counterfactual
# converts the model again with the LayerNorm kept, and that session must build. Then `fix` on
# CUDA, and the fixed file run on CUDA. Last, ONNX Runtime's own Python session on CUDA for the
# two islands of .gpu/run/islands/ (the old island shape, fed through a Cast, and the one convert
# writes now). deployed_vs_exposed.py first: the FP16 file's output with only its outputs asked
# for, and with every Pow exposed. GPU machine, repository root, after `source scripts/gpu/unstage.sh`.
set -u
R=$PWD/.gpu/run
W=/tmp/kept-ln; mkdir -p $W/out; cd $W
L=$R/layerwise
python3 $R/../../scripts/bench/make_decoder.py dec.onnx 400 --affine --ln-overflow 397 --inputs in.npz
$L convert dec.onnx --to fp16 -o dec_fp16.onnx > out/convert.txt 2>&1; echo "convert exit $?"
python3 $R/../../scripts/gpu/deployed_vs_exposed.py dec.onnx dec_fp16.onnx in.npz 2>&1 | tee out/deployed_vs_exposed.txt
start=$(date +%s%N)
$L bisect dec.onnx --inputs in.npz --ref ort:cuda,tf32=off --cand ort:cuda --cand-model dec_fp16.onnx --json out/bisect.json > out/bisect.txt 2>&1
echo "bisect exit $? in $(( ($(date +%s%N) - start) / 1000000 )) ms"; grep -E "VERDICT|^  - |keeping" out/bisect.txt | head -12
start=$(date +%s%N)
$L fix dec.onnx --inputs in.npz --ref ort:cuda,tf32=off --cand ort:cuda -o fixed.onnx --json out/fix.json > out/fix.txt 2>&1
echo "fix exit $? in $(( ($(date +%s%N) - start) / 1000000 )) ms"; grep -E "^FIX|load:|check:" out/fix.txt | cut -c1-600
$L bisect dec.onnx --inputs in.npz --ref ort:cuda,tf32=off --cand ort:cuda --cand-model fixed.onnx --json out/fixed_on_cuda.json > out/fixed_on_cuda.txt 2>&1
echo "fixed on cuda exit $?"; grep -m1 VERDICT out/fixed_on_cuda.txt
python3 - $R/islands <<'PY' 2>&1 | tee out/islands.txt
import sys, glob, os
import onnxruntime as ort
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.onnx"))):
    try:
        ort.InferenceSession(path, providers=["CUDAExecutionProvider"])
        print(os.path.basename(path), "loads on CUDA")
    except Exception as e:
        print(os.path.basename(path), "refused on CUDA:", str(e)[-200:])
PY
tar -czf "$OUT/kept_ln.tar.gz" -C $W out
