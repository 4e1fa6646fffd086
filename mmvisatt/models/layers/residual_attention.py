"""Residual attention (ReViT): pre-softmax scores carried from layer to layer.

Layer l attends with ``S_l = alpha * (q k^T / sqrt(d) + B) + (1 - alpha) * S_{l-1}`` where ``S_{l-1}`` is the
previous layer's *mixed* score tensor, so the carried state is a moving average over depth. The formula needs
``S_{l-1}`` expressed on the token pairs of layer l. For window attention the pairs change from layer to layer
(windows shift, stages merge patches and change the head count); this module holds the two ways of aligning them:

* :func:`align_by_slot` reproduces the official ReSwin code: the previous tensor is treated as a flat list of
  (window, head) slots and resized with nearest interpolation, ignoring where the windows are.
* :func:`align_by_position` aligns by image position: every current score (query p, key q) takes the previous
  score of the same pair of positions (averaged over the 2x2 children of each token after patch merging, and
  over heads when their number changes). Pairs the previous layer never scored (they sat in different windows)
  keep the plain current score. See ``docs/residual_attention.md`` for the reasoning.

Pooling attention (MViTv2, and plain ViT as its unpooled case) scores all queries against all keys, but the query
and key/value maps are pooled to strides that change from block to block, so ``S_{l-1}`` lives on other grids:
:func:`align_pooled_by_position` resamples the query and key axes on their real (H, W) grids by the ratio of their
strides. It gives the official ReMViTv2 numbers wherever the official code runs (square maps whose sides divide by
the strides; its square-grid logic is reproduced on the test side, :mod:`mmvisatt.testing.parity.revit`) and extends
it to any map size.
"""
from typing import Callable, NamedTuple, Optional, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from .attention import attention
from .shape_cache import shape_cache
from .window import WindowGrid, window_slot_of, window_token_coords


class WindowScores(NamedTuple):
    """Mixed pre-mask scores of one window-attention layer, with the partition they were computed on.

    ``scores``: (B * num_windows, heads, N, N).
    """
    scores: Tensor
    grid: WindowGrid


def align_by_slot(prev: WindowScores, grid: WindowGrid, batch: int, num_heads: int) -> Tuple[Tensor, None]:
    """The official ReSwin alignment: nearest resize over the flattened (window, head) slots of each image."""
    N = grid.window_area
    slots = prev.scores.reshape(batch, -1, N, N)
    aligned = slots.index_select(1, _slot_sources(slots.shape[1], grid.num_windows * num_heads, slots.device))
    return aligned.reshape(batch * grid.num_windows, num_heads, N, N), None


@shape_cache(maxsize=8)
def _slot_sources(num_prev: int, num_cur: int, device: torch.device) -> Tensor:
    """The previous slot each of ``num_cur`` slots takes under nearest interpolation, made on ``device``.

    The official code calls ``F.interpolate(size=...)`` on the scores, whose nearest source index is
    ``floor(i * num_prev / num_cur)`` (equal to torch 2.14's for every pair of sizes up to 400 x 120); here it
    is integer tensor arithmetic, so the selection is a gather, whose backward is far cheaper, and the sizes stay
    integers: under ``torch.compile`` with dynamic shapes a float of them would be a symbolic float, which
    AOTAutograd fails to turn into a tensor once the padded window counts are in it. Cached per shape and device
    like the window geometry, so a training step builds nothing on the host.
    """
    return torch.div(torch.arange(num_cur, device=device) * num_prev, num_cur, rounding_mode='floor')


# Blocks of a stage alternate between two partitions and batches mostly repeat their padded size, so a few
# cached maps serve most calls; int32 keeps a cached map half the size of int64 indices. They are widened per call
# and applied with torch.gather (see _take), which exports to ONNX GatherElements.
class _PairSources(NamedTuple):
    index: Tensor  # (K, L) int32
    valid: Tensor  # (K, L) bool
    divisor: Tensor  # (L, ) number of valid sources, at least 1
    any_valid: Tensor  # (num_windows, N, N) bool


@shape_cache(maxsize=8)
def _pair_sources(prev: WindowGrid, cur: WindowGrid, device: torch.device) -> _PairSources:
    """For every current (window, query, key) slot, where its pair of positions sits in ``prev``'s scores.

    ``index`` (K, L) points into the flattened previous (window, query, key) axis, ``valid`` (K, L) says which
    of those pairs the previous layer scored; L = num_windows * N * N and K is the number of fine-position pairs
    a current pair stands for (1 within a stage, 16 after a 2x patch merging).
    """
    if (prev.height, prev.width) == (cur.height, cur.width):
        factor = 1
    elif (-(-prev.height // 2), -(-prev.width // 2)) == (cur.height, cur.width):
        factor = 2
    else:
        raise ValueError(f'Cannot align residual scores from a {prev.height}x{prev.width} map to a '
                         f'{cur.height}x{cur.width} map: only equal sizes or a 2x patch merging are supported.')
    ys, xs = window_token_coords(cur, device)  # (num_windows, N) each
    offsets = torch.arange(factor, device=device)
    # children of each current token on the previous (finer) map: (num_windows, N, factor * factor)
    child_y = (ys[..., None, None] * factor + offsets[:, None]).expand(*ys.shape, factor, factor).flatten(-2)
    child_x = (xs[..., None, None] * factor + offsets[None, :]).expand(*xs.shape, factor, factor).flatten(-2)
    real = (child_y < prev.height) & (child_x < prev.width)
    window, slot = window_slot_of(child_y, child_x, prev)

    N = cur.window_area
    Np = prev.window_area
    # pair every child of the query with every child of the key: (num_windows, N, N, K)
    q_win, k_win = window[:, :, None, :, None], window[:, None, :, None, :]
    q_slot, k_slot = slot[:, :, None, :, None], slot[:, None, :, None, :]
    valid = (q_win == k_win) & real[:, :, None, :, None] & real[:, None, :, None, :]
    index = (q_win * Np + q_slot) * Np + k_slot
    K = factor ** 4
    index = index.reshape(-1, N, N, K)
    valid = valid.reshape(-1, N, N, K)
    index = torch.where(valid, index, torch.zeros_like(index)).to(torch.int32)
    count = valid.reshape(-1, K).sum(1)
    return _PairSources(index.reshape(-1, K).t().contiguous(), valid.reshape(-1, K).t().contiguous(),
                        count.clamp(min=1), (count > 0).reshape(cur.num_windows, N, N))


def align_by_position(prev: WindowScores, grid: WindowGrid, batch: int,
                      num_heads: int) -> Tuple[Tensor, Tensor]:
    """Align previous scores to the current partition by image position.

    Returns ``aligned`` (B * num_windows, heads or 1, N, N) and ``valid`` (num_windows, N, N): False where the
    previous layer scored none of the position pairs (the current score is then used unchanged).
    """
    N = grid.window_area
    prev_heads = prev.scores.shape[1]
    scores = prev.scores.reshape(batch, -1, prev_heads, prev.grid.window_area ** 2)
    if prev_heads != num_heads:
        # Heads of different widths have no one-to-one correspondence; their mean broadcasts to all new heads.
        scores = scores.mean(dim=2, keepdim=True)
    scores = scores.transpose(1, 2).flatten(2)  # (B, h, prev_windows * Np * Np)
    index, valid, divisor, any_valid = _pair_sources(prev.grid, grid, scores.device)
    if index.shape[0] == 1:
        # One source per pair (within a stage): the average below reduces to this gather, bit for bit.
        aligned = _take(scores, index[0]) * valid[0]
    else:
        total = scores.new_zeros(scores.shape[0], scores.shape[1], index.shape[1])
        for k in range(index.shape[0]):  # a loop keeps peak memory at one gather
            total = total + _take(scores, index[k]) * valid[k]
        aligned = total / divisor
    aligned = aligned.reshape(batch, -1, grid.num_windows, N, N).transpose(1, 2)
    return aligned.reshape(batch * grid.num_windows, -1, N, N), any_valid


def _take(scores: Tensor, index: Tensor) -> Tensor:
    """``scores[:, :, index]`` for (B, heads, L) scores: ``torch.gather`` over an expanded (view) index, which copies
    in one pass and exports as ONNX GatherElements."""
    return torch.gather(scores, 2, index.long().expand(scores.shape[0], scores.shape[1], -1))


def gate(alpha: Union[Tensor, float]) -> Union[Tensor, float]:
    """The residual gate as a 0-d tensor (or the float it is): a 0-d factor keeps a bf16 score map in bf16 under
    autocast, where the parameter's (1,) shape would promote every map it scales to float32."""
    return alpha.reshape(()) if isinstance(alpha, Tensor) else alpha


def _add_residual(base: Tensor, residual: Tensor, weight: Union[Tensor, float], inplace: bool = False) -> Tensor:
    """``base + weight * residual`` in one pass: in place into ``base``, or new with ``base`` broadcast."""
    if isinstance(weight, Tensor):
        return base.addcmul_(weight, residual) if inplace else torch.addcmul(base, residual, weight)
    return base.add_(residual, alpha=weight) if inplace else torch.add(base, residual, alpha=weight)


def residual_attention(q: Tensor, k: Tensor, v: Tensor, prev: Optional[Tensor] = None,
                       alpha: Union[Tensor, float] = 1.0, *, scale: float = 1.0, bias: Optional[Tensor] = None,
                       rel: Optional[Tuple[Tensor, Tensor]] = None, valid: Optional[Tensor] = None,
                       mask: Optional[Tensor] = None, residual_weight: Union[Tensor, float, None] = None,
                       dropout: float = 0., fused: bool = False, carry: bool = True) -> Tuple[Tensor, Optional[Tensor]]:
    """Residual attention (ReViT, ReSwin, ReMViTv2): ``softmax(S + mask) @ v`` and the scores ``S`` carried to the
    next layer, ``S = alpha * (scale * q k^T + bias) + (1 - alpha) * prev + rel``.

    q: (..., Nq, d); k, v: (..., Nk, d); prev: the previous layer's scores on this layer's token pairs,
    broadcastable to (..., Nq, Nk), or None in the first layer (then ``S = scale * q k^T + bias + rel``); bias: this
    layer's own additive term, mixed with the product (Swin's relative-position bias); rel: MViTv2's decomposed
    relative positions (rel_h (..., Nq, kh), rel_w (..., Nq, kw), Nk = kh * kw), added after the mix on the key grid
    and so carried on, as the official code adds them in place into the tensor it stores (a family passes ``bias``
    or ``rel``); valid: where the previous scores exist, broadcastable to the scores, None for everywhere (elsewhere
    ``S`` is the plain current score); mask: added for the softmax only (Swin's shift mask), never carried;
    residual_weight: replaces ``1 - alpha`` (a power of it for a residual several layers back); dropout: the
    probability on the attention weights; carry: False where nothing takes the scores on (the fused path then makes
    none and returns None for them).

    ``fused=False`` is the reference: the explicit softmax, the oracle the parity fixtures check. ``fused=True``
    gathers everything but the product into one map, ``D = alpha * bias + (1 - alpha) * prev + rel``, makes the
    carried map ``S = D + alpha * scale * q k^T`` with the product accumulating into ``D``, and attends with
    ``scaled_dot_product_attention`` over zero queries with ``S + mask`` as the mask (Swin's windows: over the
    real queries with ``D + mask``): the memory-efficient kernel reads the map once, keeps no probability map for
    the backward (only ``S``, which is carried on anyway) and returns the map's gradient. A partial mix (``valid``)
    weighs the product per pair, which no additive map can express: both paths compute it explicitly.
    """
    mixing = prev is not None
    alpha = gate(alpha) if mixing else 1.0
    weight = 1 - alpha if residual_weight is None else gate(residual_weight)
    if valid is not None or not fused:
        return _explicit(q, k, v, prev, alpha, weight, scale, bias, rel, valid, mask, dropout)
    # one copy of each strided view (ReSwin's): a view the attention kernel kept would hold the whole projection
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    gain = alpha * scale if mixing else scale
    q_a = q if isinstance(gain, float) and gain == 1.0 else q * gain
    k_t, shape = k.transpose(-2, -1), (*q.shape[:-1], k.shape[-2])
    if bias is not None:
        # Swin's windows: the kernel copies their 49-wide rows whatever it reads, so it attends with q and D itself
        extra = bias * alpha if not mixing else _add_residual(bias * alpha, prev, weight)
        logits = extra if mask is None else extra + mask.to(extra.dtype)
        return attention(q_a, k, v, logits, scale=1.0, dropout=dropout), (q_a @ k_t).add_(extra)
    if rel is not None:
        rel_h, rel_w = rel
        grid = rel_h[..., :, None]
        if mixing:
            # the residual and both relative-position terms in one pass over the map, and one in place
            grid = _add_residual(grid, prev.unflatten(-1, (rel_h.shape[-1], rel_w.shape[-1])), weight)
            scores = (q_a @ k_t).add_(grid.add_(rel_w[..., None, :]).flatten(-2))
        else:
            scores = (q_a @ k_t).add_((grid + rel_w[..., None, :]).flatten(-2))
    elif not carry:
        # no map to carry: the kernel attends over the real queries with the weighted residual as its mask
        logits = prev * weight if mixing else None
        if mask is not None:
            logits = mask if logits is None else logits + mask.to(logits.dtype)
        return attention(q_a, k, v, logits, scale=1.0, dropout=dropout), None
    elif mixing:
        # in place into the weighted residual, made in the product's layout: baddbmm would copy its input first
        scores = (prev.expand(shape).flatten(0, -3) * weight).baddbmm_(q_a.flatten(0, -3), k_t.flatten(0, -3))
        scores = scores.view(shape)
    elif mask is None:
        # nothing to add to the product (a first ViT layer): flash attention, and the product to carry
        return attention(q_a, k, v, scale=1.0, dropout=dropout), q_a @ k_t
    else:
        scores = q_a @ k_t
    # S is the logits: zero queries make every q.k zero (the keys are the product's, where as wide as the values), so
    # the kernel keeps S itself, carried on anyway, for the backward, and the product is made once
    keys = k if k.shape[-1] == v.shape[-1] else torch.zeros_like(v)
    logits = scores if mask is None else scores + mask.to(scores.dtype)
    return attention(q.new_zeros(*shape[:-1], v.shape[-1]), keys, v, logits, scale=1.0, dropout=dropout), scores


def _explicit(q: Tensor, k: Tensor, v: Tensor, prev: Optional[Tensor], alpha: Union[Tensor, float],
              weight: Union[Tensor, float], scale: float, bias: Optional[Tensor], rel: Optional[Tuple[Tensor, Tensor]],
              valid: Optional[Tensor], mask: Optional[Tensor], dropout: float) -> Tuple[Tensor, Tensor]:
    """The reference path of :func:`residual_attention`."""
    if prev is None or valid is not None:
        scores = (q * scale) @ k.transpose(-2, -1)
        if bias is not None:
            scores = scores + bias
        if prev is not None:
            scores = torch.where(valid, _add_residual(alpha * scores, prev, weight, inplace=True), scores)
    else:
        # alpha scales the queries and the residual goes in place into the fresh product: no score-sized
        # temporary, and autograd keeps no copy of the product for alpha's gradient
        scores = (q * (alpha * scale)) @ k.transpose(-2, -1)
        if bias is not None:
            scores = scores + bias * alpha
        _add_residual(scores, prev, weight, inplace=True)
    if rel is not None:
        rel_h, rel_w = rel
        grid = scores.unflatten(-1, (rel_h.shape[-1], rel_w.shape[-1])) + rel_h[..., :, None]
        scores = grid.add_(rel_w[..., None, :]).flatten(-2)
    attn = (scores if mask is None else scores + mask).softmax(dim=-1)
    if dropout:
        attn = F.dropout(attn, dropout)
    return attn @ v, scores


ALIGNERS = {'official': align_by_slot, 'aligned': align_by_position}


# ---------------------------------------------------------------------------------------------------------
# Pooling attention (ReViT, ReMViTv2): every query scores every key, on grids pooled to per-block strides.
# ---------------------------------------------------------------------------------------------------------
class TokenGrid(NamedTuple):
    """A row-major map of ``height`` x ``width`` tokens.

    ``stride_h``/``stride_w`` are the token spacing in tokens of the first block's input map, so grids of
    different blocks can be related by position: a token of a grid with 2x the stride stands for a 2x2 block of
    tokens of the finer grid (the block its pooling window starts at).
    """
    height: int
    width: int
    stride_h: int = 1
    stride_w: int = 1

    @property
    def size(self) -> Tuple[int, int]:
        return self.height, self.width

    @property
    def num_tokens(self) -> int:
        return self.height * self.width


class PooledScores(NamedTuple):
    """Mixed scores of one pooling-attention layer with the grids they were computed on.

    ``scores``: (B, heads, q_grid.num_tokens, kv_grid.num_tokens). ``source_q_grid``: the query grid of the layer
    that made them when it handed them on already reduced for the next layer (``score_memory='handoff'``;
    ``q_grid`` is then the next layer's query grid), else None: the next layer's input is that grid.
    """
    scores: Tensor
    q_grid: TokenGrid
    kv_grid: TokenGrid
    source_q_grid: Optional[TokenGrid] = None


class ScoreFactors(NamedTuple):
    """The carried scores of unpooled residual attention (ViT) kept as factors instead of a score tensor.

    When every layer scores the same token pairs with the same heads, the recursion
    ``S_l = alpha * R_l + (1 - alpha) * S_{l-1}`` with ``R_j = q_j k_j^T / sqrt(d)`` unrolls to
    ``S_l = (1 - alpha)^(l - b) S_b + sum_{b < j <= l} alpha (1 - alpha)^(l - j) R_j``: a stored map ``S_b`` plus
    one product of concatenated weighted queries and concatenated keys. The (B, heads, N, head_dim) factors cost
    O(N) memory per layer where a score map costs O(N^2), but they widen the product by ``head_dim`` per layer.

    ``queries`` holds the scaled queries and ``keys`` the keys of the layers since ``base`` (all layers so far when
    it is None, the first of them then weighing ``(1 - alpha)^l``); both are empty before the first layer.
    ``run``: after this many layers of factors, the next layer folds everything into a new ``base`` (its mixed
    scores, which it makes anyway) and starts again; None never stores a map.
    """
    queries: Tuple[Tensor, ...] = ()
    keys: Tuple[Tensor, ...] = ()
    base: Optional[Tensor] = None
    run: Optional[int] = None


GridOp = Callable[[Tensor], Tensor]


def on_query_axis(scores: Tensor, size: Tuple[int, int], op: GridOp) -> Tensor:
    """Apply ``op`` ((N, C, H, W) -> (N, C, H', W')) to the query grid of (B, h, H*W, Nk) scores."""
    B, h, _, Nk = scores.shape
    # (B * h, H, W, Nk) read as an NCHW map in channels-last memory: the pooling kernels take it as it lies,
    # where a transpose to contiguous NCHW would copy the whole score tensor there and back.
    out = op(scores.reshape(B * h, *size, Nk).permute(0, 3, 1, 2))
    return out.permute(0, 2, 3, 1).reshape(B, h, -1, Nk)


def on_key_axis(scores: Tensor, size: Tuple[int, int], op: GridOp) -> Tensor:
    """Apply ``op`` ((N, C, H, W) -> (N, C, H', W')) to the key grid of (B, h, Nq, H*W) scores."""
    B, h, Nq, _ = scores.shape
    return op(scores.reshape(B * h, Nq, *size)).reshape(B, h, Nq, -1)


def mean_heads_if_changed(scores: Tensor, num_heads: int) -> Tensor:
    # Heads of different widths have no one-to-one correspondence; their mean broadcasts to all new heads.
    # A single head is its own mean: a copy of it would be a score-sized tensor the next pooling saves.
    return scores if scores.shape[1] in (1, num_heads) else scores.mean(dim=1, keepdim=True)


def _pool_and_repeat(src: int, dst: int) -> Tuple[int, int]:
    """Factors (pool, repeat) that take an axis of token spacing ``src`` to spacing ``dst``."""
    if dst % src == 0:
        return dst // src, 1
    if src % dst == 0:
        return 1, src // dst
    raise ValueError(f'Cannot align residual scores between token strides {src} and {dst}: one must divide '
                     f'the other.')


def regrid_by_position(x: Tensor, src: TokenGrid, dst: TokenGrid) -> Tensor:
    """(N, C, src.height, src.width) -> (N, C, dst.height, dst.width), each axis by its stride ratio.

    Going coarser averages the block of finer tokens each coarse token stands for (a partial block at the bottom
    or right border over the tokens that exist, as the ``ceil`` sizes of the pooled maps imply); going finer
    copies a token to every token of its block.
    """
    pool_h, rep_h = _pool_and_repeat(src.stride_h, dst.stride_h)
    pool_w, rep_w = _pool_and_repeat(src.stride_w, dst.stride_w)
    if pool_h * pool_w > 1:
        x = F.avg_pool2d(x, (pool_h, pool_w), (pool_h, pool_w), ceil_mode=True)
    if rep_h > 1:
        x = x.repeat_interleave(rep_h, dim=-2)
    if rep_w > 1:
        x = x.repeat_interleave(rep_w, dim=-1)
    x = x[..., :dst.height, :dst.width]
    if tuple(x.shape[-2:]) != dst.size:
        raise ValueError(f'A {src.height}x{src.width} token map (stride {src.stride_h},{src.stride_w}) cannot be '
                         f'aligned to a {dst.height}x{dst.width} map (stride {dst.stride_h},{dst.stride_w}): the '
                         f'pooled map sizes must be ceil(size / stride), as odd pooling kernels with padding '
                         f'kernel // 2 give.')
    return x


def align_pooled_by_position(prev: PooledScores, q_grid: TokenGrid, kv_grid: TokenGrid,
                             num_heads: int) -> Tensor:
    """Previous scores on the current query and key grids by image position: (B, heads or 1, Nq, Nk).

    Queries and keys are resampled separately on their real (H, W) grids with :func:`regrid_by_position`, so
    non-square maps, odd sizes and any pooling schedule work.
    """
    scores = mean_heads_if_changed(prev.scores, num_heads)
    if prev.q_grid != q_grid:
        scores = on_query_axis(scores, prev.q_grid.size, lambda x: regrid_by_position(x, prev.q_grid, q_grid))
    if prev.kv_grid != kv_grid:
        scores = on_key_axis(scores, prev.kv_grid.size, lambda x: regrid_by_position(x, prev.kv_grid, kv_grid))
    return scores


# the residual gate's value before training (official ReViT / ReSwin / ReMViTv2: 0.5, the constant of ReSwin)
ALPHA_INIT = 0.5


def make_alpha(learnable: bool = True) -> Union[nn.Parameter, float]:
    """The residual gate: one for the whole network, used raw (no sigmoid or clamp), as in the official code; a
    constant when not learnable."""
    return nn.Parameter(torch.tensor([ALPHA_INIT])) if learnable else ALPHA_INIT
