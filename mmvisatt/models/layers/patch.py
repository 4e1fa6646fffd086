"""Patch embedding and patch merging on channels-last tokens (ViT, Swin, MViTv2 and the families built on them),
and tokens seen as an image and back."""
from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor


class PatchEmbed(nn.Module):
    """Conv patch projection to channels-last tokens, optionally followed by a LayerNorm.

    Non-overlapping patches (``stride`` = ``patch_size``, no ``padding``; Swin, ViT) pad the input to a multiple
    of the patch; overlapping ones (MViTv2's 7x7 stride-4 conv with padding 3) give ceil(H / stride) rows as is.
    """

    def __init__(self, in_channels: int, embed_dims: int, patch_size: int, stride: Optional[int] = None,
                 padding: int = 0, norm: bool = True):
        super().__init__()
        self.stride = stride or patch_size
        self.pad_input = padding == 0 and self.stride == patch_size
        self.proj = nn.Conv2d(in_channels, embed_dims, patch_size, self.stride, padding)
        self.norm = nn.LayerNorm(embed_dims) if norm else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        """(B, C_in, H, W) -> (B, ceil(H/stride), ceil(W/stride), C)."""
        if self.pad_input:
            s = self.stride
            # ceil-div of positive sizes (ONNX's integer Div truncates) rather than a modulo: under
            # torch.compile(dynamic=True) a modulo in the padded size reaches the float scale of a later resize,
            # which AOTAutograd cannot turn into a tensor
            H, W = x.shape[-2:]
            x = F.pad(x, (0, (W + s - 1) // s * s - W, 0, (H + s - 1) // s * s - H))
        # Without a norm (ViT, MViTv2) the permuted view would be the residual stream itself, and every add,
        # norm and projection after it would work across strides; one copy makes the tokens contiguous.
        return self.norm(self.proj(x).permute(0, 2, 3, 1).contiguous())


class PatchMerging(nn.Module):
    """2x2 neighbourhood concat -> LayerNorm -> linear 4C -> 2C, padding odd sizes (Swin's order of the four)."""

    def __init__(self, dim: int, out_dim: Optional[int] = None):
        super().__init__()
        self.norm = nn.LayerNorm(4 * dim)
        self.reduction = nn.Linear(4 * dim, out_dim or 2 * dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        """(B, H, W, C) -> (B, ceil(H/2), ceil(W/2), out_dim)."""
        B, H, W, C = x.shape
        x = F.pad(x, (0, 0, 0, W % 2, 0, H % 2))
        x = torch.cat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], dim=-1)
        return self.reduction(self.norm(x))


def tokens_to_map(x: Tensor, size: Tuple[int, int]) -> Tensor:
    """(B, N, C) row-major tokens of a ``size`` = (H, W) map -> a (B, C, H, W) view in channels-last memory, which
    convolutions take as it lies (for every batch size, one image included)."""
    B, N, C = x.shape
    return x.reshape(B, *size, C).permute(0, 3, 1, 2)


def map_to_tokens(x: Tensor) -> Tensor:
    """(B, C, H, W) -> (B, H * W, C) row-major tokens; a view of a channels-last map."""
    return x.permute(0, 2, 3, 1).flatten(1, 2)
