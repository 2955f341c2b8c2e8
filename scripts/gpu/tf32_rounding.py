"""How the GPU's TF32 tensor cores round float32 inputs (run on the lent GPU, PyTorch with CUDA).

A[64,64] filled with one value a, times the identity: every output is a*1 read in TF32. Values:
a = 1 + 2^-11 + 2^-13 (above halfway: round-to-nearest gives 1 + 2^-10, truncation 1),
a = 1 + 2^-11 (exactly halfway: ties-to-even gives 1, ties-away 1 + 2^-10),
a = 1 + 3 * 2^-11 (halfway above an odd neighbour: ties-to-even gives 1 + 2^-9).
The same through a 1x1 convolution (cuDNN).
"""
import json
import torch

torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.allow_tf32 = True
values = {"above_half": 1 + 2**-11 + 2**-13, "tie_to_even_down": 1 + 2**-11, "tie_to_even_up": 1 + 3 * 2**-11, "exact": 1 + 2**-10}
out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}
eye = torch.eye(64, device="cuda", dtype=torch.float32)
for name, a in values.items():
    A = torch.full((64, 64), a, device="cuda", dtype=torch.float32)
    mm = (A @ eye)[0, 0].item()
    x = torch.full((1, 64, 8, 8), a, device="cuda", dtype=torch.float32)
    w = torch.zeros((64, 64, 1, 1), device="cuda", dtype=torch.float32)
    for i in range(64):
        w[i, i, 0, 0] = 1.0
    conv = torch.nn.functional.conv2d(x, w)[0, 0, 0, 0].item()
    out[name] = {"a": a, "matmul": mm, "conv": conv, "round_to_nearest_even": None}
    # What each rounding rule gives, for reading the result.
    import struct
    bits = struct.unpack("<I", struct.pack("<f", a))[0]
    rne = struct.unpack("<f", struct.pack("<I", ((bits + 0xFFF + ((bits >> 13) & 1)) & ~0x1FFF) & 0xFFFFFFFF))[0]
    rz = struct.unpack("<f", struct.pack("<I", bits & ~0x1FFF))[0]
    rna = struct.unpack("<f", struct.pack("<I", ((bits + 0x1000) & ~0x1FFF) & 0xFFFFFFFF))[0]
    out[name].update({"round_to_nearest_even": rne, "truncate": rz, "round_half_away": rna})
print(json.dumps(out, indent=1))
