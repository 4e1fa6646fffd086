"""Pooling attention (MViTv2) with residual scores (ReViT); global ViT attention is its unpooled case.

Queries, keys and values are projected from the block input; with pooling, each is then pooled on its (H, W)
grid by a depthwise convolution shared by the heads and normalised per head (MViTv2's ``conv`` pooling), queries
at the block's stride and keys/values at a coarser one. Every pooled query scores every pooled key; the scores
are mixed with the previous layer's (:mod:`.residual_attention`), decomposed relative positions are added, and
with residual pooling the pooled query is added back to the attention output.
"""
from typing import Optional, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from .lean_scores import LeanScoreAttention, ResidualGate
from .residual_attention import (POOLED_ALIGNERS, PooledScores, ScoreFactors, TokenGrid, align_pooled_by_position,
                                 mix_scores)
from .score_factors import factored_attention
from .score_handoff import handoff_attention, plan_handoff

Pair = Tuple[int, int]


def relative_position_embeddings(table: Tensor, q_len: int, k_len: int) -> Tensor:
    """Embeddings of every query/key offset along one axis: (L, C) table -> (q_len, k_len, C).

    Offsets are counted on the finer of the two axes (the coarser one's positions are scaled by the size ratio),
    so index ``2 * max(q_len, k_len) - 2`` is the largest. A table built for other sizes (another input
    resolution) is resized linearly to that length first.
    """
    # sym_max and the resize to a length the table may already have (a copy then) keep the sizes symbolic in
    # torch.export: Python max and an `if` on them would fix the graph to the export size's branch
    length = 2 * torch.sym_max(q_len, k_len) - 1
    table = F.interpolate(table.t().unsqueeze(0), size=length, mode='linear').squeeze(0).t()
    q_ratio = torch.sym_max(k_len / q_len, 1.0)
    k_ratio = torch.sym_max(q_len / k_len, 1.0)
    # float32 0-d tensors give the products of float32 positions and Python floats bit for bit, and unlike
    # Python floats they stay tensors when export makes the sizes symbolic
    q_ratio, k_ratio, shift = (torch.scalar_tensor(r, dtype=torch.float32, device=table.device)
                               for r in (q_ratio, k_ratio, (k_len - 1) * k_ratio))
    offsets = (torch.arange(q_len, device=table.device)[:, None] * q_ratio -
               torch.arange(k_len, device=table.device)[None, :] * k_ratio)
    offsets += shift
    return table[offsets.long()]


def decomposed_rel_pos_terms(q: Tensor, q_size: Pair, kv_size: Pair, rel_pos_h: Tensor,
                             rel_pos_w: Tensor) -> Tuple[Tensor, Tensor]:
    """``q . R_h(dy)`` (B, heads, qh, qw, kh) and ``q . R_w(dx)`` (B, heads, qh, qw, kw), from the unscaled query."""
    B, heads, _, dim = q.shape
    (qh, qw), (kh, kw) = q_size, kv_size
    r_q = q.reshape(B, heads, qh, qw, dim)
    rel_h = torch.einsum('bnhwc,hkc->bnhwk', r_q, relative_position_embeddings(rel_pos_h, qh, kh))
    rel_w = torch.einsum('bnhwc,wkc->bnhwk', r_q, relative_position_embeddings(rel_pos_w, qw, kw))
    return rel_h, rel_w


def add_decomposed_rel_pos(scores: Tensor, q: Tensor, q_size: Pair, kv_size: Pair, rel_pos_h: Tensor,
                           rel_pos_w: Tensor) -> Tensor:
    """``scores + q . R_h(dy) + q . R_w(dx)`` (MViTv2's decomposed relative positions, with the unscaled query).

    scores: (B, heads, qh * qw, kh * kw); q: (B, heads, qh * qw, head_dim).
    """
    B = q.shape[0]
    (qh, qw), (kh, kw) = q_size, kv_size
    rel_h, rel_w = decomposed_rel_pos_terms(q, q_size, kv_size, rel_pos_h, rel_pos_w)
    scores = (scores.reshape(B, -1, qh, qw, kh, kw) + rel_h[..., :, None]).add_(rel_w[..., None, :])
    return scores.reshape(B, -1, qh * qw, kh * kw)


class PoolingResidualAttention(nn.Module):
    """Multi-head attention over pooled queries and keys/values whose scores are mixed with the previous layer's.

    Args:
        dim: input channels. dim_out: output channels (MViTv2 changes the width inside attention).
        num_heads: heads; the head width is ``dim_out // num_heads``.
        pool_kernel: kernel of the depthwise pooling convolutions, or None for no pooling (plain ViT).
        stride_q, stride_kv: pooling strides of queries and of keys/values.
        rel_pos_size: length of the decomposed relative-position tables (``2 * max(q, kv map side) - 1`` at the
            build resolution), or None for none.
        residual_pooling: add the pooled query to the attention output (MViTv2).
        residual_mode: how the previous layer's scores are brought onto this layer's grids, see
            :data:`~mmvisatt.models.layers.residual_attention.POOLED_ALIGNERS`.
        lean_scores: the lean score path (:mod:`.lean_scores`, default; the backbones' ``fused_attn=True``) or the
            plain autograd composition of the same ops (False): the reference the lean path is tested against, and
            what ``torch.compile`` traces. Forward values are bit-identical (where :mod:`.lean_scores` says);
            gradients equal up to summation order.
        chunk_numel: score elements per row chunk of the lean, handoff and factor paths; None (default) takes the
            input device's default (:func:`~.lean_scores.default_chunk_numel`: small on a CPU, large elsewhere).

    Three paths, then: the reference, the lean one, and a memory-saving one in a module of its own, chosen by what
    the caller passes. :class:`~mmvisatt.models.layers.residual_attention.ScoreFactors` as ``residual`` (plain ViT
    blocks; empty ones in the first layer) select the carried factors of :mod:`.score_factors`, which return the
    factors extended by this layer's; ``handoff=True`` on a block whose ``next_block`` (the next block's strides
    and heads, set by the backbone) shrinks its scores selects :mod:`.score_handoff`. Their values are those of
    the map path up to rounding.
    """

    def __init__(self, dim: int, dim_out: int, num_heads: int, qkv_bias: bool = True,
                 pool_kernel: Optional[Pair] = None, stride_q: Pair = (1, 1), stride_kv: Pair = (1, 1),
                 rel_pos_size: Optional[int] = None, residual_pooling: bool = False,
                 residual_mode: str = 'aligned', norm_eps: float = 1e-6, lean_scores: bool = True,
                 chunk_numel: Optional[int] = None):
        super().__init__()
        if chunk_numel is not None and chunk_numel < 1:
            raise ValueError(f'chunk_numel must be a positive number of score elements, or None for the '
                             f"device's default, got {chunk_numel}")
        self.chunk_numel = chunk_numel
        if residual_mode not in POOLED_ALIGNERS:
            raise ValueError(f"residual_mode must be one of {sorted(POOLED_ALIGNERS)}, got '{residual_mode}'")
        self.num_heads = num_heads
        self.dim_out = dim_out
        head_dim = dim_out // num_heads
        self.scale = head_dim ** -0.5
        self.stride_q = tuple(stride_q)
        self.stride_kv = tuple(stride_kv)
        self.residual_pooling = residual_pooling
        self.lean_scores = lean_scores
        self.align = POOLED_ALIGNERS[residual_mode]
        self.next_block: Optional[Tuple[Pair, Pair, int]] = None
        self.qkv = nn.Linear(dim, dim_out * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim_out, dim_out)
        pooled = pool_kernel is not None
        for name, stride in (('q', self.stride_q), ('k', self.stride_kv), ('v', self.stride_kv)):
            # depthwise over head_dim channels, shared by the heads (MViTv2's 'conv' mode)
            pool = nn.Conv2d(head_dim, head_dim, pool_kernel, stride, padding=[k // 2 for k in pool_kernel],
                             groups=head_dim, bias=False) if pooled else None
            setattr(self, f'pool_{name}', pool)
            setattr(self, f'norm_{name}', nn.LayerNorm(head_dim, eps=norm_eps) if pooled else None)
        if rel_pos_size is not None:
            self.rel_pos_h = nn.Parameter(torch.zeros(rel_pos_size, head_dim))
            self.rel_pos_w = nn.Parameter(torch.zeros(rel_pos_size, head_dim))
        else:
            self.rel_pos_h = self.rel_pos_w = None

    @staticmethod
    def _pool(x: Tensor, size: Pair, pool: Optional[nn.Module], norm: Optional[nn.Module]) -> Tuple[Tensor, Pair]:
        """(B, heads, H * W, head_dim) -> (B, heads, H' * W', head_dim) and (H', W')."""
        if pool is None:
            return x, size
        B, heads, _, dim = x.shape
        x = pool(x.reshape(B * heads, *size, dim).permute(0, 3, 1, 2))
        size = tuple(x.shape[-2:])
        x = x.reshape(B, heads, dim, -1).transpose(2, 3)
        return norm(x), size

    def forward(self, x: Tensor, residual: Union[PooledScores, ScoreFactors, None], alpha: Union[Tensor, float],
                handoff: bool = False) -> Tuple[Tensor, Union[PooledScores, ScoreFactors]]:
        """x: (B, H, W, dim) -> (B, H_q, W_q, dim_out), plus the mixed scores (with relative positions) to carry.

        ``residual`` holds the previous layer's scores and grids; None in the first layer. Score factors instead
        (see the class) select the factored path, which returns the factors to carry. ``handoff``: see the class.
        """
        B, H, W, _ = x.shape
        # One copy into (3, B, heads, N, d): the score products then read q, k and v as they lie, where a batched
        # matmul over the permuted projection copies its operands in every product once B > 1.
        q, k, v = self.qkv(x).reshape(B, H * W, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4).contiguous()
        if isinstance(residual, ScoreFactors):
            x, factors = factored_attention(self, q, k, v, residual, alpha)
            if self.residual_pooling:
                x = x + q
            return self.proj(x.transpose(1, 2).reshape(B, H, W, self.dim_out)), factors
        q, q_size = self._pool(q, (H, W), self.pool_q, self.norm_q)
        k, kv_size = self._pool(k, (H, W), self.pool_k, self.norm_k)
        v, _ = self._pool(v, (H, W), self.pool_v, self.norm_v)
        # this block's input is the previous block's query grid; strides accumulate from there
        if residual is None:
            in_h, in_w = 1, 1
        else:
            made_on = residual.made_on or residual.q_grid
            in_h, in_w = made_on.stride_h, made_on.stride_w
        q_grid = TokenGrid(*q_size, in_h * self.stride_q[0], in_w * self.stride_q[1])
        kv_grid = TokenGrid(*kv_size, in_h * self.stride_kv[0], in_w * self.stride_kv[1])

        # Compiled graphs take the plain composition (Inductor fuses it itself): the lean function's row-chunk
        # loops depend on the sizes, which Inductor's symbolic shapes cannot lower.
        plan = None
        if handoff and self.next_block is not None and self.align is align_pooled_by_position:
            plan = plan_handoff(q_grid, kv_grid, self.num_heads, self.next_block)
        carried = None
        if plan is not None and not torch.compiler.is_compiling():
            x, scores = handoff_attention(self, q, k, v, residual, alpha, q_grid, kv_grid,
                                          self._rel_terms(q, q_size, kv_size), plan)
            carried = PooledScores(scores, plan.q_grid, plan.kv_grid, q_grid)
        elif self.lean_scores and not torch.compiler.is_compiling():
            rel = self._rel_terms(q, q_size, kv_size)
            x, scores = self._lean_scores(q, k, v, residual, alpha, q_grid, kv_grid, rel)
        else:
            scores = (q * self.scale) @ k.transpose(-2, -1)
            if residual is not None:
                scores = mix_scores(scores, self.align(residual, q_grid, kv_grid, self.num_heads), None, alpha, 1)
            if self.rel_pos_h is not None:
                # After the mix, and kept in what is carried on: the official code adds them in place into the
                # tensor it stores, and the aligned mode keeps that so released weights keep their meaning.
                scores = add_decomposed_rel_pos(scores, q, q_size, kv_size, self.rel_pos_h, self.rel_pos_w)
            x = scores.softmax(dim=-1) @ v
        if self.residual_pooling:
            x = x + q
        x = x.transpose(1, 2).reshape(B, *q_size, self.dim_out)
        return self.proj(x), carried or PooledScores(scores, q_grid, kv_grid)

    def _rel_terms(self, q: Tensor, q_size: Pair, kv_size: Pair) -> Tuple[Optional[Tensor], Optional[Tensor]]:
        if self.rel_pos_h is None:
            return None, None
        return decomposed_rel_pos_terms(q, q_size, kv_size, self.rel_pos_h, self.rel_pos_w)

    def _lean_scores(self, q: Tensor, k: Tensor, v: Tensor, residual: Optional[PooledScores],
                     alpha: Union[Tensor, float], q_grid: TokenGrid, kv_grid: TokenGrid,
                     rel: Tuple[Optional[Tensor], Optional[Tensor]]) -> Tuple[Tensor, Tensor]:
        """The forward above through :class:`LeanScoreAttention`: the same values, one score-sized tensor."""
        aligned = None
        keep = 1 - alpha
        if residual is not None:
            gated = residual._replace(scores=ResidualGate.apply(residual.scores, keep, self.chunk_numel))
            aligned = self.align(gated, q_grid, kv_grid, self.num_heads)
        return LeanScoreAttention.apply(q * self.scale, k, v, aligned, alpha, keep, *rel, self.chunk_numel)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # Checkpoints trained at another resolution carry relative-position tables of another length.
        for name in ('rel_pos_h', 'rel_pos_w'):
            own, table = getattr(self, name), state_dict.get(prefix + name)
            if own is not None and table is not None and table.dim() == 2 and table.shape[0] != own.shape[0]:
                resized = F.interpolate(table.t().unsqueeze(0).float(), size=own.shape[0], mode='linear')
                state_dict[prefix + name] = resized.squeeze(0).t().to(table.dtype)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
