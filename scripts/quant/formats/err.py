# Relative L2 of each float output of quantized files against their float model, on ONNX Runtime CPU: python3 err.py - NAME_KIND.onnx ...
import numpy as np, onnxruntime as ort, sys, onnx, collections
def run(f, feeds):
    so=ort.SessionOptions(); so.log_severity_level=3
    s=ort.InferenceSession(f,so,providers=['CPUExecutionProvider'])
    names=[i.name for i in s.get_inputs()]
    return s.run(None,{k:v for k,v in feeds.items() if k in names}), [o.name for o in s.get_outputs()]
def rel(a,b):
    a=a.astype(np.float64); b=b.astype(np.float64); return float(np.linalg.norm(a-b)/max(np.linalg.norm(a),1e-30))
if __name__=='__main__':
  for f in sys.argv[2:]:
      name=f.split('_')[0]; feeds=dict(np.load(sys.argv[1] if sys.argv[1]!='-' else f'{name}_in.npz'))
      ref,names=run(f'{name}.onnx',feeds); cand,_=run(f,feeds)
      ops=collections.Counter(n.op_type for n in onnx.load(f).graph.node if n.op_type.startswith('QLinear') or 'Integer' in n.op_type or n.op_type in('QGemm','QAttention','DynamicQuantizeLinear','QuantizeLinear','DequantizeLinear'))
      print(f, {n: f'{rel(r,c):.3e}' for n,r,c in zip(names,ref,cand) if r.dtype.kind=='f'}, dict(ops))
