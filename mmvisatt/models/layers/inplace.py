"""In-place arithmetic that gives exactly the out-of-place result, for the fast and lean paths."""
import torch
import torch.nn as nn
import torch.nn.functional as F
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


def gelu_into(x: Tensor) -> Tensor:
    """Exact (erf) GELU of ``x``, written into ``x`` when no backward will need ``x`` (autograd off, or ``x`` not
    part of the graph); otherwise out of place, since GELU's backward reads its input. ``x`` must be a map the
    caller just made, as for :func:`add_into`."""
    if torch.is_grad_enabled() and x.requires_grad:
        return F.gelu(x)
    return torch.ops.aten.gelu_(x)


def linear_into(layer: nn.Linear, x: Tensor, out: Tensor) -> Tensor:
    """``layer(x)`` for 2-d ``x``, written into ``out`` (rows of a larger output, e.g. one strip's): the same
    product and bias as the layer computes."""
    if layer.bias is None:
        return torch.mm(x, layer.weight.t(), out=out)
    return torch.addmm(layer.bias, x, layer.weight.t(), out=out)
