"""In-place arithmetic that gives exactly the out-of-place result, for the lean score path."""
import torch
from torch import Tensor


def add_into(t: Tensor, other: Tensor) -> Tensor:
    """``t + other``, written into ``t`` when that is the same tensor: ``other`` broadcasts to ``t``'s shape and
    ``t`` already has the promoted dtype (under autocast a bfloat16 ``t`` can meet a float32 ``other``; that add
    allocates as usual). Addition commutes, so the values are bit-identical either way.

    ``t`` must be a tensor the caller just made and no backward saves (the output of a matmul, linear layer,
    convolution, scale or drop path), so that overwriting it is safe under autograd. It saves a ``t``-sized
    allocation, whose first touch costs page faults on the CPU.
    """
    if t.dtype == torch.result_type(t, other) and torch.broadcast_shapes(t.shape, other.shape) == t.shape:
        return t.add_(other)
    return t + other
