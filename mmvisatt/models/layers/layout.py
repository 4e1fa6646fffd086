"""Tokens (B, N, C) seen as a channels-last image (B, C, H, W) and back, without copies."""
from typing import Tuple

from torch import Tensor


def tokens_to_map(x: Tensor, size: Tuple[int, int]) -> Tensor:
    """(B, N, C) row-major tokens of an ``size`` = (H, W) map -> a (B, C, H, W) view with channels-last strides.

    ``x.transpose(1, 2).reshape(B, C, H, W)`` gives the same strides except one: for B = 1 the batch stride comes
    out as C. PyTorch then does not take the map for channels-last, and a convolution copies it to NCHW and runs
    there, 2-3x slower on the CPU (FAN's depthwise value convolutions at 800x1216: 606 -> 251 ms per block).
    """
    B, N, C = x.shape
    return x.reshape(B, *size, C).permute(0, 3, 1, 2)


def map_to_tokens(x: Tensor) -> Tensor:
    """(B, C, H, W) -> (B, H * W, C) row-major tokens; a view of a channels-last map."""
    return x.permute(0, 2, 3, 1).flatten(1, 2)
