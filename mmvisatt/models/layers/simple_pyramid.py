"""ViTDet's simple feature pyramid (Li et al., "Exploring Plain Vision Transformer Backbones for Object
Detection", 2022): four scales from the single map of a plain ViT, with no top-down or lateral fusion.

From a stride-s map of C channels: two 2x transposed convolutions (C -> C/2 -> C/4, LayerNorm + GELU between)
give stride s/4, one gives stride s/2 with C/2 channels, the map itself is stride s, and 2x2 max pooling gives
stride 2s. The channel halving follows ViTDet; an FPN neck takes ``in_channels=[C/4, C/2, C, C]``.
"""
from typing import Dict, List, Sequence

import torch.nn as nn
from timm.layers import LayerNorm2d
from torch import Tensor

# Scale of each output relative to the input map, and its width relative to the input width.
PYRAMID_SCALES = (4.0, 2.0, 1.0, 0.5)
PYRAMID_WIDTHS = (0.25, 0.5, 1.0, 1.0)


class SimpleFeaturePyramid(nn.Module):
    """One (B, C, H, W) map -> maps at 4x, 2x, 1x and 0.5x its resolution, only for the requested ``levels``.

    Only the branches of the requested levels are built, so unused transposed convolutions carry no parameters.
    """

    def __init__(self, dim: int, levels: Sequence[int] = (0, 1, 2, 3)):
        super().__init__()
        if dim % 4:
            raise ValueError(f'SimpleFeaturePyramid halves the width twice; {dim} channels are not divisible by 4')
        self.levels = tuple(levels)
        self.out_channels: List[int] = [int(dim * w) for w in PYRAMID_WIDTHS]
        if 0 in self.levels:
            self.up4 = nn.Sequential(
                nn.ConvTranspose2d(dim, dim // 2, 2, 2), LayerNorm2d(dim // 2, eps=1e-6), nn.GELU(),
                nn.ConvTranspose2d(dim // 2, dim // 4, 2, 2))
        if 1 in self.levels:
            self.up2 = nn.ConvTranspose2d(dim, dim // 2, 2, 2)
        if 3 in self.levels:
            # ceil_mode keeps the last row/column of odd maps, so the output has ceil(H / 2) rows like the others
            self.down2 = nn.MaxPool2d(2, 2, ceil_mode=True)

    def forward(self, x: Tensor) -> Dict[int, Tensor]:
        """(B, C, H, W) -> {level: (B, C_level, H * scale, W * scale)} (ceil for the 0.5x level)."""
        branches = {0: 'up4', 1: 'up2', 3: 'down2'}
        return {i: x if i == 2 else getattr(self, branches[i])(x) for i in self.levels}
