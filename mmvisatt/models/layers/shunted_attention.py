"""Shunted self-attention: head groups that attend to keys/values aggregated at different rates.

Ren et al., "Shunted Self-Attention via Multi-Scale Token Aggregation" (CVPR 2022). The heads of one attention
layer are split into groups; group ``g`` sees the feature map aggregated by a strided convolution of rate
``rates[g]`` (coarse groups see few large tokens, fine groups many small ones), so one layer mixes several
receptive fields. Values get a depthwise-conv "local enhancement" before the attention product. With no rates the
layer is plain multi-head attention whose local enhancement is added after the product (the official last stage).

Sizes that a rate does not divide are handled by ``odd_size``: ``'pad'`` zero-pads the map at the bottom/right to
a multiple of the rate, so every position reaches some key; ``'floor'`` convolves the map as it is and, like the
official code, drops the border rows/columns that do not fill a window.
"""
from typing import Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from .attention import attention
from .patch import tokens_to_map

ODD_SIZES = ('pad', 'floor')


def check_choice(name: str, value: str, choices: Sequence[str]) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got '{value}'")
    return value


def local_enhance(v: Tensor, conv: nn.Conv2d, size: Tuple[int, int]) -> Tensor:
    """Depthwise conv over values laid out as an image with channel = head * head_dim + d.

    v: (B, h, M, d) with M = size[0] * size[1] row-major -> (B, h, M, d).
    """
    B, h, M, d = v.shape
    image = v.transpose(-1, -2).reshape(B, h * d, *size)
    return conv(image).reshape(B, h, d, M).transpose(-1, -2)


class HeadGroupKV(nn.Module):
    """Keys and values of one head group from the map aggregated at ``rate``.

    Strided conv (kernel = stride = rate) -> LayerNorm -> GELU -> linear to K | V (each head-major), and the
    locally enhanced values V + DWConv(V). A rate of 1 is still a learned 1x1 conv, as in the official stage 3.
    """

    def __init__(self, dim: int, num_heads: int, head_dim: int, rate: int, qkv_bias: bool = False,
                 odd_size: str = 'pad'):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.rate = rate
        self.odd_size = check_choice('odd_size', odd_size, ODD_SIZES)
        group_dim = num_heads * head_dim
        self.sr = nn.Conv2d(dim, dim, kernel_size=rate, stride=rate)
        # the official code hard-codes the default eps here, unlike the block norms
        self.norm = nn.LayerNorm(dim)
        self.act = nn.GELU()
        self.kv = nn.Linear(dim, 2 * group_dim, bias=qkv_bias)
        self.local_conv = nn.Conv2d(group_dim, group_dim, 3, padding=1, groups=group_dim)

    def forward(self, x: Tensor) -> Tuple[Tensor, Tensor]:
        """x: (B, C, H, W) -> k, v: (B, heads, M, head_dim), M = aggregated H * W (ceil or floor by odd_size)."""
        if self.odd_size == 'pad':
            x = F.pad(x, (0, -x.shape[-1] % self.rate, 0, -x.shape[-2] % self.rate))
        x = self.sr(x)
        B, _, h, w = x.shape
        tokens = self.act(self.norm(x.flatten(2).transpose(1, 2)))
        k, v = self.kv(tokens).reshape(B, h * w, 2, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        return k, v + local_enhance(v, self.local_conv, (h, w))


class ShuntedAttention(nn.Module):
    """Multi-head attention whose heads are shunted into groups over keys/values aggregated at ``rates``.

    Query heads are assigned to groups in order (the first ``num_heads / len(rates)`` heads to ``rates[0]``),
    and the group outputs are concatenated in that order before ``proj``. With ``rates=()`` it is plain
    multi-head attention with the values' local enhancement added after the product.

    Args:
        dim: token width C. num_heads: total heads (divisible by the number of rates).
        rates: aggregation rate of each head group, e.g. (8, 4); () for plain attention.
        qkv_bias: biases of ``q`` and the key/value projections. qk_scale: overrides head_dim ** -0.5.
        odd_size: ``'pad'`` or ``'floor'``, see the module docstring.
        fused: ``scaled_dot_product_attention`` or the explicit softmax reference.
    """

    def __init__(self, dim: int, num_heads: int, rates: Sequence[int] = (), *, qkv_bias: bool = False,
                 qk_scale: Optional[float] = None, attn_drop: float = 0., proj_drop: float = 0., odd_size: str = 'pad',
                 fused: bool = True):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f'dim {dim} must be divisible by num_heads {num_heads}')
        if rates and num_heads % len(rates):
            raise ValueError(f'num_heads {num_heads} must split evenly into {len(rates)} head groups')
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = qk_scale or self.head_dim ** -0.5
        self.fused = fused
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        heads_per_group = num_heads // max(len(rates), 1)
        self.groups = nn.ModuleList(
            HeadGroupKV(dim, heads_per_group, self.head_dim, r, qkv_bias, odd_size) for r in rates)
        if not rates:
            self.kv = nn.Linear(dim, 2 * dim, bias=qkv_bias)
            self.local_conv = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: Tensor, size: Tuple[int, int]) -> Tensor:
        """x: (B, N, C) tokens of an H x W map (row-major), size = (H, W) -> (B, N, C)."""
        B, N, C = x.shape
        q = self.q(x).reshape(B, N, self.num_heads, self.head_dim).transpose(1, 2)
        if len(self.groups):
            image = tokens_to_map(x, size)
            out = torch.cat([
                attention(q_g, *group(image), scale=self.scale, dropout=self._dropout(), fused=self.fused)
                for q_g, group in zip(q.chunk(len(self.groups), dim=1), self.groups)
            ], dim=1)
        else:
            k, v = self.kv(x).reshape(B, N, 2, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
            out = attention(q, k, v, scale=self.scale, dropout=self._dropout(), fused=self.fused)
            out = out + local_enhance(v, self.local_conv, size)
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(B, N, C)))

    def _dropout(self) -> float:
        return self.attn_drop.p if self.training else 0.
