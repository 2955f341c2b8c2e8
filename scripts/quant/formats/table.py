# Runs layerwise bisect and fix (LAYERWISE=path) on NAME_KIND.onnx for each name and kind and measures the file, the written model and the model quantized again with the written nodes_to_exclude: python3 table.py cls,nsfw,minilm dyn,qop,qdq
import json, subprocess, sys, time, numpy as np
from err import run, rel
from make import quantize
import os; L=os.environ.get('LAYERWISE','layerwise')
rows=[]
for name in sys.argv[1].split(','):
  for kind in sys.argv[2].split(','):
    q=f'{name}_{kind}.onnx'; out=f'{name}_{kind}_fixed.onnx'
    t=time.time()
    b=subprocess.run([L,'bisect',f'{name}.onnx','--cand','ort:cpu','--cand-model',q,'--inputs',f'{name}_in.npz','--json',f'{name}_{kind}_bisect.json'],capture_output=True,text=True)
    tb=time.time()-t; t=time.time()
    f=subprocess.run([L,'fix',f'{name}.onnx','--cand','ort:cpu','--cand-model',q,'--inputs',f'{name}_in.npz','-o',out,'--json',f'{name}_{kind}_fix.json'],capture_output=True,text=True)
    tf=time.time()-t
    open(f'{name}_{kind}_bisect.txt','w').write(b.stdout+b.stderr); open(f'{name}_{kind}_fix.txt','w').write(f.stdout+f.stderr)
    try:
      br=json.load(open(f'{name}_{kind}_bisect.json')); v=br['verdict']
      fd=(br.get('first_divergent_detail') or {})
      bs=f"{v.get('status')} fd={fd.get('node')} cause={fd.get('cause',{}).get('kind') if isinstance(fd.get('cause'),dict) else fd.get('cause')}"
    except Exception as e: bs=f'bisect exit {b.returncode}: {e}'
    try:
      fr=json.load(open(f'{name}_{kind}_fix.json')); fs=f"{fr['status']} keep={len(fr['keep_fp32'])}"
    except Exception as e: fs=f'fix exit {f.returncode}: {e}'
    feeds=dict(np.load(f'{name}_in.npz'))
    ref,names=run(f'{name}.onnx',feeds)
    def err(path):
      try:
        c,_=run(path,feeds); return max(rel(r,x) for r,x in zip(ref,c) if r.dtype.kind=='f')
      except Exception as e: return str(e)[:80]
    req='-'
    try:
      ex=json.load(open(out+'.nodes-to-exclude.json'))
      key={'dyn':'onnxruntime.quantization.quantize_dynamic'}.get(kind,'onnxruntime.quantization.quantize_static')
      quantize(name,kind,f'{name}_{kind}_requant.onnx',ex[key]['nodes_to_exclude']); req=f"{err(f'{name}_{kind}_requant.onnx'):.3e}"
    except Exception as e: req=str(e)[:60]
    print(f"{name} {kind}: bisect {b.returncode} {bs} ({tb:.1f}s) | fix {f.returncode} {fs} ({tf:.1f}s) | file {err(q):.3e} | written {err(out) if f.returncode in (0,1) else '-'} | requantized with nodes_to_exclude {req}", flush=True)
