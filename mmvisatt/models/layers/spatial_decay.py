"""Spatial decay: attention biased by ``log(gamma) * distance`` between token positions (RMT's MaSA, EVT's EuSA).

A head with decay ``gamma`` (0 < gamma < 1) weights key ``m`` for query ``n`` by ``gamma ** d(n, m)``. Like the
RMT code (and RetNet), the weight is applied in log space before the softmax, ``softmax(q k^T + d * log gamma)``,
which is ``softmax(q k^T) * gamma ** d`` renormalised per row. The bias is therefore an additive float mask and
the fused path is ``scaled_dot_product_attention``, beside the explicit softmax (:mod:`.attention`).

Distances come in three forms:

- Manhattan ``|dy| + |dx|`` over a whole (H, W) grid (RMT full MaSA) and 1-D ``|i - j|`` (RMT decomposed MaSA,
  one axis at a time);
- Euclidean ``sqrt(dy^2 + dx^2)`` over a whole grid (EVT's last stage);
- Euclidean within token groups (EVT's EuSAg / EuSAd): the raster-ordered sequence is cut into groups of
  ``group_size`` tokens, consecutive (``'grouped'``) or interleaved with a stride of the number of groups
  (``'dilated'``), after padding to a multiple of ``group_size``; distances use each token's true 2-D position.

Geometry (distances, group indices) is cached per (shape, device, dtype); the per-head bias is rebuilt from the
decay buffer on each forward, because the buffer belongs to the model (it is loaded and cast with it).

The second half holds the network around the decayed attention that EVT reuses from RMT: the 4-conv stem, the
strided-conv downsampling, the block (CPE, attention, FFN) around any attention module and RMT's FFN with a
depthwise conv, all channels-last (B, H, W, C). For deployment, ``mmcv.cnn.fuse_conv_bn(model)`` folds the stem's
and the downsampling's BatchNorms into their convolutions (eval mode; same outputs).
"""
from typing import NamedTuple, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmcv.cnn import build_norm_layer
from timm.layers import DropPath, Mlp
from torch import Tensor

from .helpers import check_choice
from .shape_cache import shape_cache

# Floor of every bias. exp(-1e4) is 0 in every float type, so the floor changes no result, yet it and any sum
# of it with a finite logit stay finite in float16 (max 65504) and bfloat16: no -inf rows, no NaN.
BIAS_FLOOR = -1e4


def head_decay_rates(num_heads: int, initial_value: float, heads_range: float) -> Tensor:
    """``log(gamma_h)`` with ``gamma_h = 1 - 2 ** (-a - (b - a) * h / num_heads)`` (RMT App. D), float32 (N,).

    Computed in float32 as the RMT code does, so a recomputed buffer equals a released one bit for bit.
    """
    h = torch.arange(num_heads, dtype=torch.float)
    return torch.log(1 - 2 ** (-initial_value - heads_range * h / num_heads))


def _grid_positions(height: int, width: int, device, dtype) -> Tensor:
    """(H*W, 2) (y, x) positions in raster order."""
    ys = torch.arange(height, device=device, dtype=dtype)
    xs = torch.arange(width, device=device, dtype=dtype)
    return torch.stack(torch.meshgrid(ys, xs, indexing='ij'), dim=-1).reshape(-1, 2)


def _pairwise(pos: Tensor, metric: str) -> Tensor:
    """(..., N, 2) positions -> (..., N, N) Manhattan or Euclidean distances."""
    diff = pos[..., :, None, :] - pos[..., None, :, :]
    if metric == 'manhattan':
        return diff.abs().sum(-1)
    if metric == 'euclidean':
        return diff.pow(2).sum(-1).sqrt()
    raise ValueError(f"metric must be 'manhattan' or 'euclidean', got '{metric}'")


# few entries: a full grid's table is quadratic in the map size, and multi-scale training varies the shape
@shape_cache(maxsize=4)
def grid_distance(height: int, width: int, metric: str, device: torch.device, dtype: torch.dtype) -> Tensor:
    """(H*W, H*W) distances between the raster-ordered tokens of an (H, W) grid."""
    return _pairwise(_grid_positions(height, width, device, dtype), metric)


@shape_cache(maxsize=16)
def line_distance(length: int, device: torch.device, dtype: torch.dtype) -> Tensor:
    """(L, L) ``|i - j|``: the distance along one axis (decomposed attention)."""
    idx = torch.arange(length, device=device, dtype=dtype)
    return (idx[:, None] - idx[None, :]).abs()


def _bias_dtype(dtype: torch.dtype) -> torch.dtype:
    # half-precision biases are built in float32 and cast once at the end
    return torch.promote_types(dtype, torch.float32)


def decay_bias(log_gamma: Tensor, distance: Tensor, dtype: Optional[torch.dtype] = None) -> Tensor:
    """(heads,) log decays x (..., N, N) distances -> (heads, ..., N, N) additive bias, floored at
    :data:`BIAS_FLOOR`, in ``dtype`` (default: the decay's dtype)."""
    work = _bias_dtype(log_gamma.dtype)
    lg = log_gamma.to(work).view(-1, *([1] * distance.dim()))
    bias = (distance.to(work)[None] * lg).clamp_min(BIAS_FLOOR)
    return bias.to(dtype or log_gamma.dtype)


class TokenGroups(NamedTuple):
    """How a raster-ordered sequence of ``num_tokens`` tokens on an (H, W) grid is cut into groups.

    ``order`` (G*g,) lists the padded sequence's indices group by group (values >= ``num_tokens`` are padding);
    ``inverse`` undoes it; ``valid`` (G, g) marks real tokens; ``distance`` (G, g, g) holds the Euclidean
    distances between the true positions of the tokens of each group.
    """
    order: Tensor
    inverse: Tensor
    valid: Tensor
    distance: Tensor
    num_tokens: int
    group_size: int
    mode: str = 'grouped'

    @property
    def num_groups(self) -> int:
        return self.valid.shape[0]

    @property
    def padding(self) -> int:
        return self.order.numel() - self.num_tokens


@shape_cache(maxsize=16)
def token_groups(height: int, width: int, group_size: int, mode: str, device: torch.device,
                 dtype: torch.dtype) -> TokenGroups:
    """Cut the H*W raster sequence into groups of ``group_size`` tokens (EuSAg: ``'grouped'``, consecutive;
    EuSAd: ``'dilated'``, token ``i`` of the padded sequence joins group ``i % G``), padding it at the end to a
    multiple of ``group_size``. Fewer tokens than ``group_size`` make one group of all tokens, unpadded.
    """
    check_choice('grouping mode', mode, ('grouped', 'dilated'))
    n = height * width
    g = min(group_size, n)
    num_groups = -(-n // g)
    padded = num_groups * g
    idx = torch.arange(padded, device=device)
    order = idx if mode == 'grouped' else idx.view(g, num_groups).t().reshape(-1)
    inverse = torch.empty_like(order)
    inverse[order] = idx
    valid = (order < n).view(num_groups, g)
    # padding gets the position of the last real token; its distances never count, the key mask hides them
    pos = _grid_positions(height, width, device, dtype)[order.clamp_max(n - 1)].view(num_groups, g, 2)
    return TokenGroups(order, inverse, valid, _pairwise(pos, 'euclidean'), n, g, mode)


def group_bias(log_gamma: Tensor, groups: TokenGroups, dtype: Optional[torch.dtype] = None) -> Tensor:
    """(heads, G, g, g) Euclidean decay bias inside each group; padded keys get :data:`BIAS_FLOOR`."""
    bias = decay_bias(log_gamma, groups.distance, _bias_dtype(log_gamma.dtype))
    if groups.padding:
        bias = bias.masked_fill(~groups.valid[None, :, None, :], BIAS_FLOOR)
    return bias.to(dtype or log_gamma.dtype)


def group_tokens(x: Tensor, groups: TokenGroups) -> Tensor:
    """(B, N, C) -> (B, G, g, C), zero-padding the sequence to G*g tokens.

    A reshape, as Swin's window partition: EuSAg's groups are consecutive stretches of the padded sequence, and
    EuSAd's are its columns when it is read as a (g, G) grid.
    """
    if groups.padding:
        x = F.pad(x, (0, 0, 0, groups.padding))
    if groups.mode == 'grouped':
        return x.unflatten(1, (groups.num_groups, groups.group_size))
    return x.unflatten(1, (groups.group_size, groups.num_groups)).transpose(1, 2)


def ungroup_tokens(x: Tensor, groups: TokenGroups) -> Tensor:
    """Inverse of :func:`group_tokens`: (B, G, g, C) -> (B, N, C), dropping the padding."""
    if groups.mode == 'dilated':
        x = x.transpose(1, 2)
    return x.flatten(1, 2)[:, :groups.num_tokens]


class SpatialDecay(nn.Module):
    """Per-head decay rates of one stage (``log_gamma``, a persistent buffer) and the biases built from them.

    Args:
        num_heads: heads of the stage's attention; head ``h`` gets ``gamma_h = 1 - 2 ** (-a - (b - a) h / N)``.
        initial_value: ``a`` (RMT: 2).
        heads_range: ``b - a`` (RMT: 4, 5 or 6).
    """

    def __init__(self, num_heads: int, initial_value: float = 2., heads_range: float = 4.):
        super().__init__()
        self.register_buffer('log_gamma', head_decay_rates(num_heads, initial_value, heads_range))

    def _dist_dtype(self) -> torch.dtype:
        return _bias_dtype(self.log_gamma.dtype)

    def grid(self, height: int, width: int, metric: str, dtype: torch.dtype) -> Tensor:
        """(heads, H*W, H*W) bias of full attention over the grid."""
        dist = grid_distance(height, width, metric, self.log_gamma.device, self._dist_dtype())
        return decay_bias(self.log_gamma, dist, dtype)

    def line(self, length: int, dtype: torch.dtype) -> Tensor:
        """(heads, L, L) bias of attention along one axis."""
        return decay_bias(self.log_gamma, line_distance(length, self.log_gamma.device, self._dist_dtype()), dtype)

    def groups(self, height: int, width: int, group_size: int, mode: str,
               dtype: torch.dtype) -> Tuple[TokenGroups, Tensor]:
        """The grouping of an (H, W) grid and its (heads, G, g, g) bias."""
        groups = token_groups(height, width, group_size, mode, self.log_gamma.device, self._dist_dtype())
        return groups, group_bias(self.log_gamma, groups, dtype)

    def extra_repr(self) -> str:
        return 'gamma=' + ', '.join(f'{g:.4f}' for g in self.log_gamma.exp().tolist())


# ---------------------------------------------------------------------------------------------------------
# Stem, downsampling, FFN and block (RMT's, reused by EVT)
# ---------------------------------------------------------------------------------------------------------
def _depthwise(conv: nn.Conv2d, x: Tensor) -> Tensor:
    return conv(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)


class ConvFFN(nn.Module):
    """fc1 -> GELU -> h + DWConv3x3(h) -> fc2."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.dwconv = nn.Conv2d(hidden, hidden, 3, 1, 1, groups=hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: Tensor) -> Tensor:
        h = self.act(self.fc1(x))
        return self.fc2(h + _depthwise(self.dwconv, h))


class RetentiveBlock(nn.Module):
    """x += DWConv3x3(x) (CPE); x += ls1 * attn(LN(x)); x += ls2 * FFN(LN(x)).

    ``attn`` is any module called as ``attn(x, *context)`` with the context its stage prepares (MaSA in RMT, EuSA
    in EVT), so the two families share the block. ``conv_ffn`` picks RMT's FFN (:class:`ConvFFN`); EVT's is the
    classic two-layer MLP (timm's ``Mlp``, same ``fc1`` / ``fc2`` names).
    """

    def __init__(self, dim: int, attn: nn.Module, mlp_ratio: float, drop_path: float = 0.,
                 layer_scale: Optional[float] = None, conv_ffn: bool = True):
        super().__init__()
        self.cpe = nn.Conv2d(dim, dim, 3, 1, 1, groups=dim)
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = attn
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        hidden = int(mlp_ratio * dim)
        self.ffn = ConvFFN(dim, hidden) if conv_ffn else Mlp(dim, hidden, act_layer=nn.GELU)
        self.drop_path = DropPath(drop_path) if drop_path > 0. else nn.Identity()
        if layer_scale is not None:
            self.gamma_1 = nn.Parameter(torch.full((dim, ), float(layer_scale)))
            self.gamma_2 = nn.Parameter(torch.full((dim, ), float(layer_scale)))
        else:
            self.gamma_1 = self.gamma_2 = None

    def forward(self, x: Tensor, *context) -> Tensor:
        x = x + _depthwise(self.cpe, x)
        x = x + self._branch(self.attn(self.norm1(x), *context), self.gamma_1)
        return x + self._branch(self.ffn(self.norm2(x)), self.gamma_2)

    def _branch(self, y: Tensor, gamma: Optional[Tensor]) -> Tensor:
        return self.drop_path(y if gamma is None else gamma * y)


class ConvStem(nn.Module):
    """Four 3x3 convs (stride 2, 1, 2, 1; widths C/2, C/2, C, C), each with a BatchNorm (``norm_cfg``, default
    ``BN``; the official dense code uses SyncBN), GELU after the first three: (B, C_in, H, W) ->
    (B, ceil(H/4), ceil(W/4), C)."""

    def __init__(self, in_channels: int, dim: int, norm_cfg: Optional[dict] = None):
        super().__init__()
        half = dim // 2
        layers = []
        for i, (cin, cout, stride) in enumerate([(in_channels, half, 2), (half, half, 1), (half, dim, 2),
                                                 (dim, dim, 1)]):
            layers += [nn.Conv2d(cin, cout, 3, stride, 1), build_norm_layer(norm_cfg or dict(type='BN'), cout)[1]]
            if i < 3:
                layers.append(nn.GELU())
        self.proj = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        # A permuted NCHW map would keep every residual add, norm and projection of the stage working across
        # strides (each add inherits its first operand's layout); one copy here makes the whole stage contiguous.
        return self.proj(x).permute(0, 2, 3, 1).contiguous()


class ConvDownsample(nn.Module):
    """3x3 stride-2 conv + BatchNorm (``norm_cfg``, default ``BN``): (B, H, W, C) -> (B, ceil(H/2), ceil(W/2),
    C_out)."""

    def __init__(self, dim: int, out_dim: int, norm_cfg: Optional[dict] = None):
        super().__init__()
        self.reduction = nn.Conv2d(dim, out_dim, 3, 2, 1)
        self.norm = build_norm_layer(norm_cfg or dict(type='BN'), out_dim)[1]

    def forward(self, x: Tensor) -> Tensor:
        # contiguous channels-last tokens for the next stage, as ConvStem
        return self.norm(self.reduction(x.permute(0, 3, 1, 2))).permute(0, 2, 3, 1).contiguous()
