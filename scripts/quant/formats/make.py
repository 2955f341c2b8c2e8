# Quantizes a float model three ways (quantize_static QDQ and QOperator without pre-processing, quantize_dynamic) on fixed seeded samples; docs/quantization.md, "Formats as users make them".
import numpy as np, onnx, sys, os
from onnxruntime.quantization import quantize_dynamic, quantize_static, QuantFormat, QuantType, CalibrationDataReader
def smooth(rng, shape):
    x=rng.normal(size=shape).astype(np.float32)
    for ax in range(len(shape)):
        if shape[ax]>8: x=(x+np.roll(x,1,ax)+np.roll(x,2,ax)+np.roll(x,-1,ax))/2
    return np.clip(x/(np.abs(x).max()+1e-6),-1,1).astype(np.float32)
def feeds(name, rng):
    if name=='cls': return {'x':smooth(rng,(1,3,48,192))}
    if name=='nsfw': return {'input_0':(smooth(rng,(1,224,224,3))*120+100).astype(np.float32)}
    if name=='minilm':
        ids=np.array([[101]+list(rng.integers(1000,30000,30))+[102]],dtype=np.int64)
        return {'input_ids':ids,'attention_mask':np.ones_like(ids)}
def calib(name):
    rng=np.random.default_rng(1)
    return [feeds(name,rng) for _ in range(8)]
class R(CalibrationDataReader):
    def __init__(s,name): s.it=iter(calib(name))
    def get_next(s): return next(s.it,None)
def quantize(name, kind, out, exclude=()):
    src=f'{name}.onnx'
    if kind=='dyn': quantize_dynamic(src,out,weight_type=QuantType.QInt8,nodes_to_exclude=list(exclude))
    elif kind=='qop': quantize_static(src,out,R(name),quant_format=QuantFormat.QOperator,per_channel=True,activation_type=QuantType.QUInt8,weight_type=QuantType.QInt8,nodes_to_exclude=list(exclude))
    elif kind=='qdq': quantize_static(src,out,R(name),quant_format=QuantFormat.QDQ,per_channel=True,activation_type=QuantType.QInt8,weight_type=QuantType.QInt8,nodes_to_exclude=list(exclude))
if __name__=='__main__':
    for name in ['cls','nsfw','minilm']:
        np.savez(f'{name}_in.npz',**feeds(name,np.random.default_rng(7)))
        for kind in sys.argv[1:]: quantize(name,kind,f'{name}_{kind}.onnx')
