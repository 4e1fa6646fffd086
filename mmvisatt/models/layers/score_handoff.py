"""Score handoff (ReMViTv2's memory-saving path, ``handoff``): a block whose scores the next block shrinks (pools
their queries or keys, or averages their heads) hands them on already shrunk, row chunk by row chunk, and
recomputes ``q k^T`` in the backward instead of keeping its own map. Neither the map nor its gradient is ever
whole. Only for ``residual_mode='aligned'``; the values are those of the map path up to rounding.
"""
import contextlib
from typing import Callable, ContextManager, List, NamedTuple, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from . import lean_scores
from .residual_attention import (PooledScores, TokenGrid, _on_key_axis, _on_query_axis, _pool_and_repeat,
                                 regrid_by_position)

Pair = Tuple[int, int]


class ScoreHandoff(NamedTuple):
    """The part of the next block's alignment (:func:`align_pooled_by_position`) that shrinks the carried map:
    the head mean (``mean_heads``), then average pooling of the query grid by ``q_pool`` and of the key grid by
    ``kv_pool``. Done by the block that makes the map, it never has to hold the map whole. ``q_grid`` and
    ``kv_grid`` are the grids of the map handed on; what is left to the next block (repeating keys onto a finer
    grid) only enlarges."""
    mean_heads: bool
    q_size: Pair
    q_pool: Pair
    kv_size: Pair
    kv_pool: Pair
    q_grid: TokenGrid
    kv_grid: TokenGrid

    def reduce(self, scores: Tensor, grid_rows: int) -> Tensor:
        """(B, heads, grid_rows * q_width, Nk) scores of whole query-grid rows -> the rows they hand on."""
        if self.mean_heads:
            scores = scores.mean(dim=1, keepdim=True)
        if self.q_pool != (1, 1):
            scores = _on_query_axis(scores, (grid_rows, self.q_size[1]), self._pool(self.q_pool))
        if self.kv_pool != (1, 1):
            scores = _on_key_axis(scores, self.kv_size, self._pool(self.kv_pool))
        return scores

    @staticmethod
    def _pool(kernel: Pair) -> Callable[[Tensor], Tensor]:
        # regrid_by_position's pooling: a partial window at the bottom / right border averages the tokens it has
        return lambda x: F.avg_pool2d(x, kernel, kernel, ceil_mode=True)


def _pooled_grid(grid: TokenGrid, pool: Pair) -> TokenGrid:
    return TokenGrid(-(-grid.height // pool[0]), -(-grid.width // pool[1]), grid.stride_h * pool[0],
                     grid.stride_w * pool[1])


def plan_handoff(q_grid: TokenGrid, kv_grid: TokenGrid, num_heads: int,
                 next_block: Tuple[Pair, Pair, int]) -> Optional[ScoreHandoff]:
    """What this block's scores can shed before the next block (its query stride, key/value stride and heads)
    aligns them; None when nothing (the map is handed on as it is) or when the next query grid is not a pooling of
    this one."""
    stride_q, stride_kv, next_heads = next_block
    next_q, next_kv = _pooled_grid(q_grid, stride_q), _pooled_grid(q_grid, stride_kv)
    try:
        q_axes = [_pool_and_repeat(a, b) for a, b in zip((q_grid.stride_h, q_grid.stride_w),
                                                         (next_q.stride_h, next_q.stride_w))]
        kv_axes = [_pool_and_repeat(a, b) for a, b in zip((kv_grid.stride_h, kv_grid.stride_w),
                                                          (next_kv.stride_h, next_kv.stride_w))]
    except ValueError:
        return None
    if any(repeat > 1 for _, repeat in q_axes):
        return None
    q_pool, kv_pool = (q_axes[0][0], q_axes[1][0]), (kv_axes[0][0], kv_axes[1][0])
    out_q = _pooled_grid(q_grid, q_pool)
    mean_heads = num_heads not in (1, next_heads)
    if out_q.size != next_q.size or (not mean_heads and q_pool == (1, 1) and kv_pool == (1, 1)):
        return None
    return ScoreHandoff(mean_heads, q_grid.size, q_pool, kv_grid.size, kv_pool, out_q, _pooled_grid(kv_grid, kv_pool))


def _handoff_row_chunks(handoff: ScoreHandoff, row_numel: int, budget: int) -> List[Tuple[int, int, int]]:
    """Token-row ranges of whole query-pooling windows (grid rows in multiples of ``q_pool[0]``), within
    ``budget`` score elements (:func:`lean_scores.row_chunks`); each with the first handed-on row it makes."""
    (qh, qw), ph = handoff.q_size, handoff.q_pool[0]
    out_w = handoff.q_grid.width
    units = -(-qh // ph)
    chunks = []
    for u0, u1 in lean_scores.row_chunks(units, row_numel * qw * ph, budget):
        r0, r1 = u0 * ph, min(u1 * ph, qh)
        chunks.append((r0 * qw, r1 * qw, u0 * out_w))
    return chunks


def _handoff_chunk(q_s: Tensor, k: Tensor, v: Tensor, prev: Optional[Tensor], alpha: Union[Tensor, float],
                   keep: Union[Tensor, float], rel_h: Optional[Tensor], rel_w: Optional[Tensor],
                   expand: Optional[Callable[[Tensor], Tensor]], handoff: ScoreHandoff,
                   grid_rows: int) -> Tuple[Tensor, Tensor]:
    """One chunk of query rows: the mixed scores (the ops of the lean path, in its order), ``softmax @ v`` and the
    rows handed on. ``prev`` holds the chunk's rows of the residual on this block's query grid; ``expand`` puts
    its keys onto this block's key grid."""
    scores = q_s @ k.transpose(-2, -1)
    if prev is not None:
        if not (isinstance(alpha, float) and alpha == 1.0):
            scores = alpha * scores
        scores = scores + keep * (prev if expand is None else expand(prev))
    if rel_h is not None:
        B, heads, rows, Nk = scores.shape
        kh, kw = rel_h.shape[-1], rel_w.shape[-1]
        grid = scores.view(B, heads, rows, kh, kw) + rel_h[..., :, None]
        scores = (grid + rel_w[..., None, :]).view(B, heads, rows, Nk)
    out = scores.softmax(dim=-1) @ v
    return out, handoff.reduce(scores, grid_rows)


def _autocast_as_recorded(ctx) -> ContextManager:
    if not torch.amp.is_autocast_available(ctx.device_type):
        return contextlib.nullcontext()
    return torch.autocast(ctx.device_type, dtype=ctx.autocast_dtype, enabled=ctx.autocast)


class HandoffScoreAttention(torch.autograd.Function):
    """:class:`LeanScoreAttention` for a block whose scores shrink before the next block uses them
    (:class:`ScoreHandoff`): returns the attention output and the handed-on map, made row chunk by row chunk, so
    the block's own map never exists whole. Nothing score-sized is saved: the backward recomputes each chunk
    (one more ``q k^T`` than the lean path) and differentiates it with autograd, like a checkpoint per chunk.

    Autocast is recorded in the forward and restored for the recomputation, as ``torch.utils.checkpoint`` does.
    """

    @staticmethod
    def forward(ctx, handoff: ScoreHandoff, expand: Optional[Callable[[Tensor], Tensor]], q_s: Tensor, k: Tensor,
                v: Tensor, prev: Optional[Tensor], alpha: Union[Tensor, float], keep: Union[Tensor, float],
                rel_h: Optional[Tensor], rel_w: Optional[Tensor],
                budget: Optional[int] = None) -> Tuple[Tensor, Tensor]:
        B, heads, Nq, _ = q_s.shape
        qw = handoff.q_size[1]
        ctx.device_type = q_s.device.type
        # devices without autocast (the meta device of a FLOP count) have no state to record
        ctx.autocast = torch.amp.is_autocast_available(ctx.device_type) and torch.is_autocast_enabled(ctx.device_type)
        ctx.autocast_dtype = torch.get_autocast_dtype(ctx.device_type) if ctx.autocast else None
        rel_h, rel_w = _flat_rows(rel_h), _flat_rows(rel_w)
        chunks = _handoff_row_chunks(handoff, B * heads * k.shape[-2], lean_scores.chunk_numel(budget, q_s.device))
        out = handed = None
        for a, b, c in chunks:
            part, rows = _handoff_chunk(q_s[:, :, a:b], k, v, _rows(prev, a, b), alpha, keep, _rows(rel_h, a, b),
                                        _rows(rel_w, a, b), expand, handoff, (b - a) // qw)
            if out is None:
                out = part.new_empty(B, heads, Nq, part.shape[-1])
                handed = rows.new_empty(B, rows.shape[1], handoff.q_grid.num_tokens, rows.shape[-1])
            out[:, :, a:b] = part
            handed[:, :, c:c + rows.shape[2]] = rows
        ctx.handoff, ctx.expand, ctx.chunks = handoff, expand, chunks
        ctx.floats = tuple(None if torch.is_tensor(t) else t for t in (alpha, keep))
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(q_s, k, v, prev, *(t if torch.is_tensor(t) else None for t in (alpha, keep)),
                              rel_h, rel_w)
        return out, handed

    @staticmethod
    def backward(ctx, d_out: Optional[Tensor], d_handed: Optional[Tensor]):
        q_s, k, v, prev, alpha_t, keep_t, rel_h, rel_w = ctx.saved_tensors
        handoff, qw = ctx.handoff, ctx.handoff.q_size[1]
        wants = ctx.needs_input_grad
        leaf = lambda t, i: None if t is None else t.detach().requires_grad_(wants[i])  # noqa: E731
        k_l, v_l, alpha_l, keep_l = leaf(k, 3), leaf(v, 4), leaf(alpha_t, 6), leaf(keep_t, 7)
        alpha = ctx.floats[0] if alpha_l is None else alpha_l
        keep = ctx.floats[1] if keep_l is None else keep_l
        sliced = dict(q_s=q_s, prev=prev, rel_h=rel_h, rel_w=rel_w)  # inputs whose rows the chunks split
        grads = dict.fromkeys(sliced)
        shared = dict.fromkeys(('k', 'v', 'alpha', 'keep'))
        for a, b, c in ctx.chunks:
            with torch.enable_grad(), _autocast_as_recorded(ctx):
                inputs = dict(q_s=leaf(q_s[:, :, a:b], 2), prev=leaf(_rows(prev, a, b), 5),
                              rel_h=leaf(_rows(rel_h, a, b), 8), rel_w=leaf(_rows(rel_w, a, b), 9))
                part, rows = _handoff_chunk(inputs['q_s'], k_l, v_l, inputs['prev'], alpha, keep, inputs['rel_h'],
                                            inputs['rel_w'], ctx.expand, handoff, (b - a) // qw)
            outputs, seeds = [], []
            if d_out is not None:
                outputs.append(part)
                seeds.append(d_out[:, :, a:b])
            if d_handed is not None:
                outputs.append(rows)
                seeds.append(d_handed[:, :, c:c + rows.shape[2]])
            targets = {n: t for n, t in {**inputs, 'k': k_l, 'v': v_l, 'alpha': alpha_l, 'keep': keep_l}.items()
                       if t is not None and t.requires_grad}
            if not outputs or not targets:
                continue
            found = torch.autograd.grad(outputs, list(targets.values()), seeds, allow_unused=True)
            for name, grad in zip(targets, found):
                if grad is None:
                    continue
                if name in shared:
                    shared[name] = grad if shared[name] is None else shared[name] + grad
                else:
                    if grads[name] is None:
                        grads[name] = sliced[name].new_zeros(sliced[name].shape)
                    grads[name][:, :, a:b] = grad
        d_rel_h, d_rel_w = (None if g is None else g.view(src.shape[:2] + (-1, qw, src.shape[-1]))
                            for g, src in ((grads['rel_h'], rel_h), (grads['rel_w'], rel_w)))
        return (None, None, grads['q_s'], shared['k'], shared['v'], grads['prev'], shared['alpha'], shared['keep'],
                d_rel_h, d_rel_w, None)


def _key_regrid(src: TokenGrid, dst: TokenGrid) -> Callable[[Tensor], Tensor]:
    """Rows of scores on key grid ``src`` -> the same rows on key grid ``dst`` (the aligner's key step)."""
    return lambda rows: _on_key_axis(rows, src.size, lambda m: regrid_by_position(m, src, dst))


def _flat_rows(t: Optional[Tensor]) -> Optional[Tensor]:
    """(B, heads, qh, qw, n) relative-position terms -> (B, heads, qh * qw, n): one row per query."""
    return None if t is None else t.flatten(2, 3)


def _rows(t: Optional[Tensor], a: int, b: int) -> Optional[Tensor]:
    # a residual with one head broadcasts over the heads; its rows are sliced all the same
    return None if t is None else t[:, :, a:b]


def handoff_attention(attn, q: Tensor, k: Tensor, v: Tensor, residual: Optional[PooledScores],
                      alpha: Union[Tensor, float], q_grid: TokenGrid, kv_grid: TokenGrid,
                      rel: Tuple[Optional[Tensor], Optional[Tensor]], plan: ScoreHandoff) -> Tuple[Tensor, Tensor]:
    """``attn``'s (a ``PoolingResidualAttention``) lean-path values through :class:`HandoffScoreAttention`, with
    the decomposed relative-position terms ``rel`` (or Nones); returns the output and the handed-on map."""
    prev = expand = None
    if residual is not None:
        if residual.q_grid == q_grid and residual.scores.shape[1] in (1, attn.num_heads):
            # handed on by the previous block: only its keys may still need repeating onto this key grid,
            # which each row chunk does for itself
            prev = residual.scores
            if residual.kv_grid != kv_grid:
                expand = _key_regrid(residual.kv_grid, kv_grid)
        else:
            prev = attn.align(residual, q_grid, kv_grid, attn.num_heads)
    return HandoffScoreAttention.apply(plan, expand, q * attn.scale, k, v, prev, alpha, 1 - alpha, *rel,
                                       attn.chunk_numel)
