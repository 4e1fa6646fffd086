"""Window partitioning for (shifted) window attention on arbitrary feature-map sizes.

A :class:`WindowGrid` records how a feature map was cut into windows. Blocks need it twice: to build the
attention mask, and to tell the next block's residual-score alignment which image positions a score belonged to.
"""
from typing import NamedTuple, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from .attention import attention
from .shape_cache import shape_cache

# Swin's mask value. Kept instead of -inf so that scores of masked pairs stay finite and bit-compatible with
# the official implementations.
MASK_VALUE = -100.0


class WindowGrid(NamedTuple):
    """Geometry of one window partition.

    ``height``/``width`` are the real feature-map size, ``padded_h``/``padded_w`` the size after padding to a
    multiple of ``window``, and ``shift`` the cyclic shift applied before partitioning (0 for W-MSA).
    """
    height: int
    width: int
    padded_h: int
    padded_w: int
    window: int
    shift: int

    @classmethod
    def build(cls, height: int, width: int, window: int, shift: int) -> 'WindowGrid':
        # A map that fits in one window gains nothing from shifting; Swin disables it there too.
        if height <= window and width <= window:
            shift = 0
        padded_h = -(-height // window) * window
        padded_w = -(-width // window) * window
        return cls(height, width, padded_h, padded_w, window, shift)

    @property
    def num_windows(self) -> int:
        return (self.padded_h // self.window) * (self.padded_w // self.window)

    @property
    def window_area(self) -> int:
        return self.window * self.window


def window_partition(x: Tensor, window: int) -> Tensor:
    """(B, H, W, C) with H, W multiples of ``window`` -> (B * num_windows, window * window, C)."""
    B, H, W, C = x.shape
    x = x.view(B, H // window, window, W // window, window, C)
    return x.permute(0, 1, 3, 2, 4, 5).reshape(-1, window * window, C)


def window_reverse(windows: Tensor, window: int, height: int, width: int) -> Tensor:
    """Inverse of :func:`window_partition`: (B * num_windows, window * window, C) -> (B, H, W, C)."""
    C = windows.shape[-1]
    x = windows.view(-1, height // window, width // window, window, window, C)
    return x.permute(0, 1, 3, 2, 4, 5).reshape(-1, height, width, C)


def partition_windows(x: Tensor, grid: WindowGrid) -> Tensor:
    """Pad, shift and partition a (B, H, W, C) map as ``grid`` says."""
    pad_h, pad_w = grid.padded_h - grid.height, grid.padded_w - grid.width
    if pad_h or pad_w:
        x = F.pad(x, (0, 0, 0, pad_w, 0, pad_h))
    if grid.shift:
        x = torch.roll(x, shifts=(-grid.shift, -grid.shift), dims=(1, 2))
    return window_partition(x, grid.window)


def merge_windows(windows: Tensor, grid: WindowGrid) -> Tensor:
    """Inverse of :func:`partition_windows`, cropping the padding away: -> (B, H, W, C)."""
    x = window_reverse(windows, grid.window, grid.padded_h, grid.padded_w)
    if grid.shift:
        x = torch.roll(x, shifts=(grid.shift, grid.shift), dims=(1, 2))
    return x[:, :grid.height, :grid.width].contiguous()


def relative_position_index(window: int) -> Tensor:
    """(window**2, window**2) index into a ((2*window-1)**2, heads) relative-position bias table."""
    coords = torch.stack(torch.meshgrid(torch.arange(window), torch.arange(window), indexing='ij')).flatten(1)
    rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + (window - 1)
    return rel[..., 0] * (2 * window - 1) + rel[..., 1]


def window_region_labels(grid: WindowGrid, device: Optional[torch.device] = None) -> Tensor:
    """(num_windows, window**2) label per token; tokens may attend to each other only if labels match.

    Labels separate the regions that a cyclic shift wraps together (Swin's nine slices) and give padded tokens
    a label of their own, so padding never acts as a key for real tokens.
    """
    Hp, Wp, M, s = grid.padded_h, grid.padded_w, grid.window, grid.shift
    labels = torch.zeros(Hp, Wp, dtype=torch.long, device=device)
    if s:
        bounds_h = (0, Hp - M, Hp - s, Hp)
        bounds_w = (0, Wp - M, Wp - s, Wp)
        for i in range(3):
            for j in range(3):
                labels[bounds_h[i]:bounds_h[i + 1], bounds_w[j]:bounds_w[j + 1]] = i * 3 + j
    if Hp > grid.height or Wp > grid.width:
        pad = torch.ones(Hp, Wp, dtype=torch.bool, device=device)
        pad[:grid.height, :grid.width] = False
        labels[torch.roll(pad, shifts=(-s, -s), dims=(0, 1))] = -1
    return window_partition(labels[None, :, :, None], M).squeeze(-1)


# Every block of a stage asks for the same one or two masks; building them is a few full-size passes.
@shape_cache(maxsize=16)
def window_attention_mask(grid: WindowGrid, device: Optional[torch.device] = None) -> Optional[Tensor]:
    """(num_windows, N, N) additive mask, or None when every pair may attend (no shift, no padding).

    The tensor is cached per (grid, device) and shared: do not modify it in place.
    """
    if not grid.shift and grid.padded_h == grid.height and grid.padded_w == grid.width:
        return None
    labels = window_region_labels(grid, device)
    mask = torch.zeros(labels.shape[0], labels.shape[1], labels.shape[1], device=device)
    return mask.masked_fill(labels[:, :, None] != labels[:, None, :], MASK_VALUE)


def window_token_coords(grid: WindowGrid, device: Optional[torch.device] = None) -> Tensor:
    """(2, num_windows, window**2): unshifted (y, x) feature-map coordinates of every window slot."""
    ys, xs = torch.meshgrid(torch.arange(grid.padded_h, device=device), torch.arange(grid.padded_w, device=device),
                            indexing='ij')
    coords = torch.stack([ys, xs], dim=-1)
    if grid.shift:
        coords = torch.roll(coords, shifts=(-grid.shift, -grid.shift), dims=(0, 1))
    return window_partition(coords[None], grid.window).permute(2, 0, 1)


def window_slot_of(y: Tensor, x: Tensor, grid: WindowGrid):
    """Window index and in-window slot of unshifted coordinates (y, x) under ``grid`` (inverse of coords)."""
    M = grid.window
    ry = (y - grid.shift) % grid.padded_h
    rx = (x - grid.shift) % grid.padded_w
    window = (ry // M) * (grid.padded_w // M) + rx // M
    slot = (ry % M) * M + rx % M
    return window, slot


def resize_relative_position_table(table: Tensor, size: int) -> Tensor:
    """Bicubically resize a ((2M-1)**2, heads) table to (size**2, heads)."""
    old = int(table.shape[0] ** 0.5)
    grid = table.t().reshape(1, -1, old, old).float()
    grid = F.interpolate(grid, size=(size, size), mode='bicubic', align_corners=False)
    return grid.reshape(-1, size * size).t().to(table.dtype)


class WindowAttention(nn.Module):
    """Swin's window multi-head self-attention with a learned relative-position bias of a ``window_size`` window
    (``relative_position_bias_table``, the checkpoints' key, indexed by a non-persistent buffer), resized on load
    when a checkpoint was trained with another window size (e.g. 12 at 384 px). ``fused`` picks the attention
    primitive's path (:func:`~.attention.attention`)."""

    def __init__(self, dim: int, num_heads: int, window_size: int, *, qkv_bias: bool = True, attn_drop: float = 0.,
                 proj_drop: float = 0., fused: bool = True):
        super().__init__()
        self.num_heads = num_heads
        self.window_size = window_size
        self.fused = fused
        self.attn_drop = nn.Dropout(attn_drop)
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * window_size - 1) ** 2, num_heads))
        self.register_buffer('relative_position_index', relative_position_index(window_size), persistent=False)

    def forward(self, x: Tensor, num_windows: int, mask: Optional[Tensor] = None) -> Tensor:
        """x: (B * num_windows, N, C); mask: additive (num_windows, N, N) -> (B * num_windows, N, C)."""
        BW, N, C = x.shape
        h = self.num_heads
        q, k, v = self.qkv(x).reshape(-1, num_windows, N, 3, h, C // h).permute(3, 0, 1, 4, 2, 5)
        bias = self.relative_position_bias()
        if mask is not None:
            bias = bias + mask[:, None]
        out = attention(q, k, v, bias, dropout=self.attn_drop.p if self.training else 0., fused=self.fused)
        return self.proj_drop(self.proj(out.transpose(2, 3).reshape(BW, N, C)))

    def relative_position_bias(self) -> Tensor:
        """(heads, N, N) bias of the window's token pairs, N = window_size ** 2."""
        N = self.window_size ** 2
        bias = self.relative_position_bias_table[self.relative_position_index.view(-1)]
        return bias.view(N, N, -1).permute(2, 0, 1)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        key = prefix + 'relative_position_bias_table'
        table = state_dict.get(key)
        if table is not None and table.shape != self.relative_position_bias_table.shape:
            state_dict[key] = resize_relative_position_table(table, 2 * self.window_size - 1)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
