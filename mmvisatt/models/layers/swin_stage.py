"""Swin's stage, whatever its blocks attend with: the stage of ReSwin and FAN-Swin."""
from typing import Callable, Optional, Sequence

import torch.nn as nn
from torch import Tensor

from .checkpoint import checkpoint, checkpoint_seq
from .patch import PatchMerging


class SwinStage(nn.Module):
    """Optional patch merging (``in_dim`` -> ``dim`` channels, stride 2), then ``depth`` blocks alternating W-MSA
    and SW-MSA: block ``i`` is ``make_block(shifted=i % 2 == 1, drop_path=drop_path[i])``.

    Blocks map (B, H, W, C) to (B, H, W, C). Called with state (``stage(x, carried, alpha)``) the blocks take and
    return it (``block(x, carried, alpha) -> (x, carried)``, ReSwin's residual scores) and so does the stage.
    """

    def __init__(self, in_dim: int, dim: int, depth: int, *, downsample: bool, drop_path: Sequence[float],
                 make_block: Callable[..., nn.Module], with_cp: bool = False):
        super().__init__()
        self.with_cp = with_cp
        self.downsample: Optional[nn.Module] = PatchMerging(in_dim, dim) if downsample else None
        self.blocks = nn.ModuleList(make_block(shifted=i % 2 == 1, drop_path=drop_path[i]) for i in range(depth))

    def forward(self, x: Tensor, *state):
        if self.downsample is not None:
            x = self.downsample(x)
        if not state:
            return checkpoint_seq(self.blocks, x, enabled=self.with_cp)
        carried, alpha = state
        for block in self.blocks:
            x, carried = checkpoint(block, x, carried, alpha, enabled=self.with_cp)
        return x, carried
