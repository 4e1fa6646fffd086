"""Activation checkpointing that leaves BatchNorm statistics as a plain forward would.

A checkpointed module runs twice per training step: once in the forward, once when the backward recomputes
it. A BatchNorm in training mode normalises with the batch statistics, so its recomputed output equals the first
one, but each call also updates ``running_mean`` / ``running_var`` / ``num_batches_tracked`` (and a SyncBN
all-reduces again), so a plain ``torch.utils.checkpoint`` updates them twice (pytorch/pytorch#96136). Here the
recomputation runs between a snapshot and a restore of those buffers, so only the first call counts. Modules
without running statistics are checkpointed plainly.
"""
import contextlib
from typing import Any, Iterator, List

import torch
import torch.nn as nn
import torch.utils.checkpoint as cp
from torch import Tensor
from torch.nn.modules.batchnorm import _NormBase


def _running_buffers(module: nn.Module) -> List[Tensor]:
    # only norms in training mode update their statistics (norm_eval and frozen stages keep theirs in eval)
    return [buf for m in module.modules() if isinstance(m, _NormBase) and m.training and m.track_running_stats
            for buf in m.buffers() if buf is not None]


@contextlib.contextmanager
def _restored(buffers: List[Tensor]) -> Iterator[None]:
    # restoring what the buffers held when the recomputation started (not before the first call) keeps the
    # updates of several forward passes before one backward
    saved = [buf.clone() for buf in buffers]
    try:
        yield
    finally:
        with torch.no_grad():
            for buf, value in zip(buffers, saved):
                buf.copy_(value)


def _needs_grad(module: nn.Module, args: tuple) -> bool:
    if not torch.is_grad_enabled():
        return False
    return (any(isinstance(a, Tensor) and a.requires_grad for a in args)
            or any(p.requires_grad for p in module.parameters()))


def checkpoint(module: nn.Module, *args, enabled: bool = True) -> Any:
    """``module(*args)``, under activation checkpointing when ``enabled`` and a gradient will flow through it.

    The image does not require grad, so a stem is checkpointed whenever its own parameters train.
    """
    if not enabled or not _needs_grad(module, args):
        return module(*args)
    buffers = _running_buffers(module)
    if not buffers or torch.compiler.is_compiling():
        # compiled graphs apply each buffer mutation once and recompute only pure ops in the backward graph
        # (and checkpoint accepts no other context_fn there)
        return cp.checkpoint(module, *args, use_reentrant=False)
    return cp.checkpoint(module, *args, use_reentrant=False,
                         context_fn=lambda: (contextlib.nullcontext(), _restored(buffers)))


def checkpoint_seq(blocks: nn.ModuleList, x: Tensor, *args, enabled: bool = True) -> Tensor:
    """``x = block(x, *args)`` for each block, each one checkpointed as :func:`checkpoint` does."""
    for block in blocks:
        x = checkpoint(block, x, *args, enabled=enabled)
    return x
