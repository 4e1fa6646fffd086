"""How the pooled and global residual attention of ReViT and ReMViTv2 keeps its score maps: the backbones'
``score_memory`` argument.

* ``'full'`` (the default): :func:`~.residual_attention.residual_attention` under plain autograd, the reference.
  Autograd saves the product ``q k^T``, the carried mix and the softmax output of every block for the backward:
  three score maps per block besides the one carried on. It compiles.
* ``'handoff'`` (ReMViTv2): every block runs the same function row chunk by row chunk and recomputes each chunk
  in the backward (:class:`RowChunkAttention`, a checkpoint per chunk), so only the carried map is kept. A block
  whose scores the next block shrinks (pools their queries or keys, or averages their heads) hands them on
  already shrunk (:class:`ScoreReduction`), so its own map never exists whole.
* ``'factors'`` (ReViT): plain ViT blocks score the same token pairs with the same heads, so the carried scores
  unroll to a weighted sum of the blocks' ``q k^T``, one product of concatenated weighted queries and keys
  (:class:`~.residual_attention.ScoreFactors`, :func:`factored_attention`), attended by row chunks. Every ``run``
  blocks one block folds them into a map, which bounds the product's width.

The chunked strategies give the reference's values up to summation order, outputs and gradients. Their chunk
loops are Python loops over the sizes, which ``torch.compile`` does not trace: their entry points are
``torch.compiler.disable``-d, so a compiled model runs them eagerly between its graphs (one break per block).
The chunk size is one global setting, :func:`set_score_chunk_numel`, as timm keeps its attention switch.
"""
import contextlib
from typing import Callable, ContextManager, List, NamedTuple, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from .helpers import check_choice
from .residual_attention import (ScoreFactors, TokenGrid, _pool_and_repeat, gate, on_key_axis, on_query_axis,
                                 regrid_by_position, residual_attention)

Pair = Tuple[int, int]
SCORE_MEMORY = ('full', 'handoff', 'factors')

_CHUNK_NUMEL = 1 << 26


def set_score_chunk_numel(numel: int) -> None:
    """Score elements per row chunk of the chunked strategies (default 2**26, 256 MiB of float32): the bound on a
    chunk's softmax temporaries. Values do not depend on it beyond summation order."""
    global _CHUNK_NUMEL
    if int(numel) < 1:
        raise ValueError(f'the score chunk size must be a positive number of elements, got {numel}')
    _CHUNK_NUMEL = int(numel)


def score_chunk_numel() -> int:
    """The row-chunk size :func:`set_score_chunk_numel` set."""
    return _CHUNK_NUMEL


def check_score_memory(value: str, allowed: Tuple[str, ...], owner: str) -> str:
    """``value`` if ``owner`` (a backbone) offers that strategy; the error names the owner's choices."""
    if value not in allowed:
        raise ValueError(f"{owner} takes score_memory in {allowed}, got {value!r} (see "
                         f"mmvisatt.models.layers.score_memory)")
    return value


def _pooled_grid(grid: TokenGrid, pool: Pair) -> TokenGrid:
    return TokenGrid(-(-grid.height // pool[0]), -(-grid.width // pool[1]), grid.stride_h * pool[0],
                     grid.stride_w * pool[1])


class ScoreReduction(NamedTuple):
    """The part of the next block's alignment (:func:`~.residual_attention.align_pooled_by_position`) that shrinks
    the carried map: the head mean, then average pooling of the query grid by ``q_pool`` and of the key grid by
    ``kv_pool``. ``q_grid`` and ``kv_grid`` are the grids of the map handed on; what is left to the next block
    (repeating keys onto a finer grid) only enlarges. With nothing to shrink it hands the map on as it is."""
    mean_heads: bool
    q_size: Pair
    q_pool: Pair
    kv_size: Pair
    kv_pool: Pair
    q_grid: TokenGrid
    kv_grid: TokenGrid

    @classmethod
    def none(cls, q_grid: TokenGrid, kv_grid: TokenGrid) -> 'ScoreReduction':
        return cls(False, q_grid.size, (1, 1), kv_grid.size, (1, 1), q_grid, kv_grid)

    @classmethod
    def plan(cls, q_grid: TokenGrid, kv_grid: TokenGrid, num_heads: int,
             next_block: Optional[Tuple[Pair, Pair, int]]) -> 'ScoreReduction':
        """What this block's scores can shed before the next block (its query stride, key/value stride and heads;
        None for the last block) aligns them; nothing where the next query grid is not a pooling of this one."""
        if next_block is None:
            return cls.none(q_grid, kv_grid)
        stride_q, stride_kv, next_heads = next_block
        next_q, next_kv = _pooled_grid(q_grid, stride_q), _pooled_grid(q_grid, stride_kv)
        try:
            q_axes = [_pool_and_repeat(a, b) for a, b in zip((q_grid.stride_h, q_grid.stride_w),
                                                             (next_q.stride_h, next_q.stride_w))]
            kv_axes = [_pool_and_repeat(a, b) for a, b in zip((kv_grid.stride_h, kv_grid.stride_w),
                                                              (next_kv.stride_h, next_kv.stride_w))]
        except ValueError:
            return cls.none(q_grid, kv_grid)
        q_pool, kv_pool = (q_axes[0][0], q_axes[1][0]), (kv_axes[0][0], kv_axes[1][0])
        out_q = _pooled_grid(q_grid, q_pool)
        if any(repeat > 1 for _, repeat in q_axes) or out_q.size != next_q.size:
            return cls.none(q_grid, kv_grid)
        return cls(num_heads not in (1, next_heads), q_grid.size, q_pool, kv_grid.size, kv_pool, out_q,
                   _pooled_grid(kv_grid, kv_pool))

    @property
    def shrinks(self) -> bool:
        return self.mean_heads or self.q_pool != (1, 1) or self.kv_pool != (1, 1)

    def reduce(self, scores: Tensor, grid_rows: int) -> Tensor:
        """(B, heads, grid_rows * q_width, Nk) scores of whole query-grid rows -> the rows they hand on."""
        if self.mean_heads:
            scores = scores.mean(dim=1, keepdim=True)
        if self.q_pool != (1, 1):
            scores = on_query_axis(scores, (grid_rows, self.q_size[1]), self._pool(self.q_pool))
        if self.kv_pool != (1, 1):
            scores = on_key_axis(scores, self.kv_size, self._pool(self.kv_pool))
        return scores

    @staticmethod
    def _pool(kernel: Pair) -> Callable[[Tensor], Tensor]:
        # regrid_by_position's pooling: a partial window at the bottom / right border averages the tokens it has
        return lambda x: F.avg_pool2d(x, kernel, kernel, ceil_mode=True)

    def row_chunks(self, row_numel: int) -> List[Tuple[int, int, int]]:
        """Token-row ranges of whole query-pooling windows (grid rows in multiples of ``q_pool[0]``) of at most
        :func:`score_chunk_numel` score elements (one window when it alone is larger); each with the first
        handed-on row it makes."""
        (qh, qw), ph = self.q_size, self.q_pool[0]
        units = -(-qh // ph)
        step = max(1, score_chunk_numel() // max(row_numel * qw * ph, 1))
        return [(u0 * ph * qw, min((u0 + step) * ph, qh) * qw, u0 * self.q_grid.width)
                for u0 in range(0, units, step)]


def _chunk(q_s: Tensor, k: Tensor, v: Tensor, prev: Optional[Tensor], alpha: Union[Tensor, float],
           residual_weight: Union[Tensor, float, None], rel_h: Optional[Tensor], rel_w: Optional[Tensor],
           expand: Optional[Callable[[Tensor], Tensor]], reduction: ScoreReduction, grid_rows: int, fused: bool,
           carry: bool) -> Tuple[Tensor, Optional[Tensor]]:
    if prev is not None and expand is not None:
        prev = expand(prev)
    out, scores = residual_attention(q_s, k, v, prev, alpha, rel=None if rel_h is None else (rel_h, rel_w),
                                     residual_weight=residual_weight, fused=fused, carry=carry)
    return out, reduction.reduce(scores, grid_rows) if carry else None


def _autocast_as_recorded(ctx) -> ContextManager:
    if not torch.amp.is_autocast_available(ctx.device_type):
        return contextlib.nullcontext()
    return torch.autocast(ctx.device_type, dtype=ctx.autocast_dtype, enabled=ctx.autocast)


def _rows(t: Optional[Tensor], a: int, b: int) -> Optional[Tensor]:
    # a residual with one head broadcasts over the heads; its rows are sliced all the same
    return None if t is None else t[:, :, a:b]


class RowChunkAttention(torch.autograd.Function):
    """:func:`~.residual_attention.residual_attention` row chunk by row chunk: the attention output and the
    scores ``reduction`` hands on (none when ``carry`` is False). Nothing score-sized is saved: the backward
    recomputes each chunk and differentiates it with autograd, like a checkpoint per chunk, so the gradients are
    the reference's by construction. Autocast is recorded in the forward and restored for the recomputation, as
    ``torch.utils.checkpoint`` does.

    ``prev`` holds the residual on this block's query grid; ``expand`` puts each chunk's keys onto this block's
    key grid (a repeat the previous block left undone). ``rel_h`` (B, heads, Nq, kh), ``rel_w`` (B, heads, Nq, kw).
    ``fused`` chooses the path of every chunk, forward and recomputed."""

    @staticmethod
    def forward(ctx, reduction: ScoreReduction, expand: Optional[Callable[[Tensor], Tensor]], carry: bool,
                fused: bool, q_s: Tensor, k: Tensor, v: Tensor, prev: Optional[Tensor], alpha: Union[Tensor, float],
                residual_weight: Union[Tensor, float, None], rel_h: Optional[Tensor],
                rel_w: Optional[Tensor]) -> Tuple[Tensor, Optional[Tensor]]:
        B, heads, Nq, _ = q_s.shape
        qw = reduction.q_size[1]
        ctx.device_type = q_s.device.type
        # devices without autocast (the meta device of a FLOP count) have no state to record
        ctx.autocast = torch.amp.is_autocast_available(ctx.device_type) and torch.is_autocast_enabled(ctx.device_type)
        ctx.autocast_dtype = torch.get_autocast_dtype(ctx.device_type) if ctx.autocast else None
        chunks = reduction.row_chunks(B * heads * k.shape[-2])
        out = handed = None
        for a, b, c in chunks:
            part, rows = _chunk(q_s[:, :, a:b], k, v, _rows(prev, a, b), alpha, residual_weight, _rows(rel_h, a, b),
                                _rows(rel_w, a, b), expand, reduction, (b - a) // qw, fused, carry)
            if out is None:
                out = part.new_empty(B, heads, Nq, part.shape[-1])
                if carry:
                    handed = rows.new_empty(B, rows.shape[1], reduction.q_grid.num_tokens, rows.shape[-1])
            out[:, :, a:b] = part
            if carry:
                handed[:, :, c:c + rows.shape[2]] = rows
        ctx.reduction, ctx.expand, ctx.chunks, ctx.fused, ctx.carry = reduction, expand, chunks, fused, carry
        ctx.floats = tuple(None if torch.is_tensor(t) else t for t in (alpha, residual_weight))
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(q_s, k, v, prev, *(t if torch.is_tensor(t) else None for t in (alpha, residual_weight)),
                              rel_h, rel_w)
        return out, handed

    @staticmethod
    def backward(ctx, d_out: Optional[Tensor], d_handed: Optional[Tensor]):
        q_s, k, v, prev, alpha_t, weight_t, rel_h, rel_w = ctx.saved_tensors
        qw = ctx.reduction.q_size[1]
        wants = ctx.needs_input_grad
        leaf = lambda t, i: None if t is None else t.detach().requires_grad_(wants[i])  # noqa: E731
        k_l, v_l, alpha_l, weight_l = leaf(k, 5), leaf(v, 6), leaf(alpha_t, 8), leaf(weight_t, 9)
        alpha = ctx.floats[0] if alpha_l is None else alpha_l
        weight = ctx.floats[1] if weight_l is None else weight_l
        sliced = dict(q_s=q_s, prev=prev, rel_h=rel_h, rel_w=rel_w)  # inputs whose rows the chunks split
        grads = dict.fromkeys(sliced)
        shared = dict.fromkeys(('k', 'v', 'alpha', 'weight'))
        for a, b, c in ctx.chunks:
            with torch.enable_grad(), _autocast_as_recorded(ctx):
                inputs = dict(q_s=leaf(q_s[:, :, a:b], 4), prev=leaf(_rows(prev, a, b), 7),
                              rel_h=leaf(_rows(rel_h, a, b), 10), rel_w=leaf(_rows(rel_w, a, b), 11))
                part, rows = _chunk(inputs['q_s'], k_l, v_l, inputs['prev'], alpha, weight, inputs['rel_h'],
                                    inputs['rel_w'], ctx.expand, ctx.reduction, (b - a) // qw, ctx.fused, ctx.carry)
            outputs, seeds = [], []
            if d_out is not None:
                outputs.append(part)
                seeds.append(d_out[:, :, a:b])
            if d_handed is not None:
                outputs.append(rows)
                seeds.append(d_handed[:, :, c:c + rows.shape[2]])
            targets = {n: t for n, t in {**inputs, 'k': k_l, 'v': v_l, 'alpha': alpha_l, 'weight': weight_l}.items()
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
        return (None, None, None, None, grads['q_s'], shared['k'], shared['v'], grads['prev'], shared['alpha'],
                shared['weight'], grads['rel_h'], grads['rel_w'])


@torch.compiler.disable
def chunked_attention(q_s: Tensor, k: Tensor, v: Tensor, prev: Optional[Tensor], alpha: Union[Tensor, float],
                      rel_h: Optional[Tensor], rel_w: Optional[Tensor], reduction: ScoreReduction,
                      kv_grid: TokenGrid, prev_kv_grid: Optional[TokenGrid] = None,
                      fused: bool = False) -> Tuple[Tensor, Tensor]:
    """:class:`RowChunkAttention` of a pooling-attention block: the output and the map ``reduction`` hands on.
    ``prev`` is on this block's query grid; on ``prev_kv_grid`` (None: on ``kv_grid``), each chunk repeats its
    keys onto ``kv_grid``."""
    expand = None
    if prev_kv_grid is not None and prev_kv_grid != kv_grid:
        expand = lambda rows: on_key_axis(  # noqa: E731
            rows, prev_kv_grid.size, lambda m: regrid_by_position(m, prev_kv_grid, kv_grid))
    return RowChunkAttention.apply(reduction, expand, True, fused, q_s, k, v, prev, alpha, None, rel_h, rel_w)


@torch.compiler.disable
def factored_attention(q_s: Tensor, k: Tensor, v: Tensor, size: Pair, carried: ScoreFactors,
                       alpha: Union[Tensor, float], fused: bool = False) -> Tuple[Tensor, ScoreFactors]:
    """``softmax(S_l) @ v`` of an unpooled block with ``S_l`` built from the carried factors and this block's
    scaled queries ``q_s`` and keys ``k`` (see :class:`~.residual_attention.ScoreFactors`)."""
    queries, keys, base, run = carried
    depth = len(queries)
    alpha = gate(alpha)  # 0-d: the weighted queries keep autocast's dtype
    residual_weight = 1 - alpha
    # the unrolled moving average: factor j weighs (1 - alpha)^(depth - j) times alpha, except the network's
    # first layer (no base), which had no residual to mix with
    weighted = [pq * (residual_weight ** (depth - j) if j == 0 and base is None
                      else alpha * residual_weight ** (depth - j)) for j, pq in enumerate(queries)]
    own = q_s if depth == 0 and base is None else alpha * q_s
    q_cat = torch.cat([*weighted, own], dim=-1) if weighted else own
    k_cat = torch.cat([*keys, k], dim=-1) if keys else k
    fold = run is not None and depth + 1 >= run
    base_weight = None if base is None else residual_weight ** (depth + 1)
    grid = TokenGrid(*size)
    # the queries carry their weights, so the product's own weight is 1 and the base's is a power of 1 - alpha
    out, scores = RowChunkAttention.apply(ScoreReduction.none(grid, grid), None, fold, fused, q_cat, k_cat, v, base,
                                          1.0, base_weight, None, None)
    if fold:
        return out, ScoreFactors(base=scores, run=run)
    return out, ScoreFactors(queries + (q_s, ), keys + (k, ), base, run)


def set_score_memory(model: torch.nn.Module, value: str) -> torch.nn.Module:
    """Switch every module of ``model`` that has a ``score_memory`` (the backbone and its attentions) to ``value``,
    in place: a deployment step, e.g. to the reference, whose graph an exporter can trace, before an export.
    Values do not change beyond rounding."""
    check_choice('score_memory', value, SCORE_MEMORY)
    for module in model.modules():
        if hasattr(module, 'score_memory'):
            module.score_memory = value
    return model
