"""
TF32 for the float32 matmuls and convolutions left on CUDA (train.py and bench.py, on CUDA only),
set through one API. torch 2.9 added `fp32_precision` beside the legacy `allow_tf32` flags, and a
process that mixes them (a library sets one, we set the other) raises a RuntimeError when the
flag is read; so the new API where torch has it, else the legacy flags, never both.
"""
import torch


def allow_tf32(backends=torch.backends):
    """TF32 on for CUDA float32 matmuls (cuBLAS) and convolutions (cuDNN) -> the API used."""
    if hasattr(backends.cuda.matmul, "fp32_precision"):  # torch >= 2.9
        backends.cuda.matmul.fp32_precision = "tf32"
        backends.cudnn.conv.fp32_precision = "tf32"
        return "fp32_precision"
    backends.cuda.matmul.allow_tf32 = True
    backends.cudnn.allow_tf32 = True
    return "allow_tf32"
