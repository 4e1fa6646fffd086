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
"""
from typing import NamedTuple, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

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


# Few entries: at 1333x800 a stride-16 grid's table alone is 70 MB, and multi-scale training varies the shape.
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
    if mode not in ('grouped', 'dilated'):
        raise ValueError(f"grouping mode must be 'grouped' or 'dilated', got '{mode}'")
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
    """(B, N, C) -> (B, G, g, C), zero-padding the sequence to G*g tokens."""
    if groups.padding:
        x = F.pad(x, (0, 0, 0, groups.padding))
    return x[:, groups.order].unflatten(1, (groups.num_groups, groups.group_size))


def ungroup_tokens(x: Tensor, groups: TokenGroups) -> Tensor:
    """Inverse of :func:`group_tokens`: (B, G, g, C) -> (B, N, C), dropping the padding."""
    return x.flatten(1, 2)[:, groups.inverse[:groups.num_tokens]]


class GroupRun(NamedTuple):
    """Consecutive groups whose tokens sit at fixed strides of the raster sequence, so they are a strided view:
    group ``first_group + i``, slot ``j`` is token ``start + i * group_stride + j * slot_stride``; each group has
    ``length`` real tokens (its first slots)."""
    start: int
    first_group: int
    num_groups: int
    length: int
    group_stride: int
    slot_stride: int


def group_runs(groups: TokenGroups) -> Tuple[GroupRun, ...]:
    """The groups of :func:`token_groups` as strided runs over the unpadded sequence: full groups, then the groups
    whose last slots are padding, without the padding (which the bias hides from every real query anyway)."""
    n, g, num_groups = groups.num_tokens, groups.group_size, groups.num_groups
    if groups.mode == 'grouped':
        # only the last group can be short
        last = n - (num_groups - 1) * g
        runs = [GroupRun(0, 0, num_groups - 1, g, g, 1), GroupRun((num_groups - 1) * g, num_groups - 1, 1, last, g, 1)]
    else:
        # slot j of group i is token i + j * G, so the first n % G groups hold one real token more than the rest
        slots, longer = divmod(n, num_groups)
        runs = [GroupRun(0, 0, longer, slots + 1, 1, num_groups),
                GroupRun(longer, longer, num_groups - longer, slots, 1, num_groups)]
    return tuple(run for run in runs if run.num_groups > 0 and run.length > 0)


def _run_view(t: Tensor, run: GroupRun, groups: TokenGroups) -> Tensor:
    """The tokens of ``run`` as a (B, run.num_groups, run.length, C) view of ``t``: for EuSAg a reshape of the
    run's stretch of the (unpadded) sequence, for EuSAd a slice of the padded sequence viewed as (g, G) and
    transposed."""
    B, _, C = t.shape
    if groups.mode == 'grouped':
        stretch = t[:, run.start:run.start + run.num_groups * run.length]
        return stretch.view(B, run.num_groups, run.length, C)
    grid = t.view(B, groups.group_size, groups.num_groups, C).transpose(1, 2)
    return grid[:, run.first_group:run.first_group + run.num_groups, :run.length]


def grouped_attention_fused(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, groups: TokenGroups,
                            num_heads: int) -> Tensor:
    """Decayed attention (``k`` pre-scaled) within the groups of ``groups``, fused, reading the groups as views.

    q, k, v: (B, N, C) raster-ordered (``k`` scaled), C = heads * d; bias: (heads, G, g, g). Returns (B, N, C).
    Gathering and permuting the tokens into (B * heads * G, g, d), as the reference path does, costs more than
    the fused kernel itself on groups this short (docs/performance.md); so each run of :func:`group_runs` is read
    as a view (:func:`_run_view`), handed to the kernel in one call for all images, and its output written once.
    Only EuSAd pads the sequence (a copy), because its last slots straddle the end. The padded keys of the
    reference path carry a bias of :data:`BIAS_FLOOR` (softmax weight exactly 0), so leaving them out changes no
    real query's result. Reshapes and slices (no ``as_strided``) keep it exportable to ONNX.
    """
    B, N, C = q.shape
    d = C // num_heads
    pad = groups.padding if groups.mode == 'dilated' else 0
    q, k, v = (F.pad(t, (0, 0, 0, pad)) if pad else t.contiguous() for t in (q, k, v))
    out = q.new_empty(q.shape)
    bias = bias.to(q.dtype)
    for run in group_runs(groups):
        # (groups, heads, length, length): the mask's batch axis is the group axis of the views
        mask = bias[:, run.first_group:run.first_group + run.num_groups, :run.length, :run.length].transpose(0, 1)
        # One call per run for the whole batch: images x groups are the kernel's batch axis. The fused kernels
        # take four dimensions only (a fifth falls back to the materialising math path), so the views are
        # reshaped (a copy where they do not merge) and the mask repeated over the images.
        G, L = run.num_groups, run.length
        qs, ks, vs = (_run_view(t, run, groups).reshape(B * G, L, num_heads, d).transpose(1, 2) for t in (q, k, v))
        mask = mask.expand(B, *mask.shape).reshape(B * G, num_heads, L, L)
        result = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=1.0)
        _run_view(out, run, groups).copy_(result.transpose(1, 2).reshape(B, G, L, C))
    return out[:, :N]


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
