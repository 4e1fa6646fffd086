"""Pooling attention (MViTv2) with residual scores (ReViT), and the pre-norm block around it; global ViT attention
is its unpooled case. ReViT and ReMViTv2 share both.

Queries, keys and values are projected from the block input; with pooling, each is then pooled on its (H, W)
grid by a depthwise convolution shared by the heads and normalised per head (MViTv2's ``conv`` pooling), queries
at the block's stride and keys/values at a coarser one. Every pooled query scores every pooled key; the scores
are mixed with the previous layer's (:func:`~.residual_attention.residual_attention`), decomposed relative
positions are added, and with residual pooling the pooled query is added back to the attention output.
"""
import math
from typing import Optional, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import DropPath, Mlp
from torch import Tensor

from .residual_attention import PooledScores, ScoreFactors, TokenGrid, align_pooled_by_position, residual_attention
from .score_memory import SCORE_MEMORY, ScoreReduction, check_score_memory, chunked_attention, factored_attention

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
    """MViTv2's decomposed relative positions from the unscaled query (B, heads, qh * qw, head_dim):
    ``q . R_h(dy)`` (B, heads, qh * qw, kh) and ``q . R_w(dx)`` (B, heads, qh * qw, kw), one row per query."""
    B, heads, _, dim = q.shape
    (qh, qw), (kh, kw) = q_size, kv_size
    r_q = q.reshape(B, heads, qh, qw, dim)
    rel_h = torch.einsum('bnhwc,hkc->bnhwk', r_q, relative_position_embeddings(rel_pos_h, qh, kh))
    rel_w = torch.einsum('bnhwc,wkc->bnhwk', r_q, relative_position_embeddings(rel_pos_w, qw, kw))
    return rel_h.flatten(2, 3), rel_w.flatten(2, 3)


class PoolingResidualAttention(nn.Module):
    """Multi-head attention over pooled queries and keys/values whose scores are mixed with the previous layer's.

    ``fused`` attends with ``scaled_dot_product_attention`` and the carried scores as its bias, ``False`` with the
    explicit softmax (:func:`~.residual_attention.residual_attention`); ``score_memory`` chooses how the maps are
    kept.

    Args:
        dim: input channels. dim_out: output channels (MViTv2 changes the width inside attention).
        num_heads: heads; the head width is ``dim_out // num_heads``.
        qkv_bias: bias of the query/key/value projection.
        pool_kernel: kernel of the depthwise pooling convolutions, or None for no pooling (plain ViT).
        stride_q, stride_kv: pooling strides of queries and of keys/values.
        rel_pos_size: length of the decomposed relative-position tables (``2 * max(q, kv map side) - 1`` at the
            build resolution), or None for none.
        residual_pooling: add the pooled query to the attention output (MViTv2).
        score_memory: ``'full'``, ``'handoff'`` or ``'factors'`` (:mod:`.score_memory`); ``'factors'`` needs
            unpooled blocks without relative positions.
        next_block: the next block's query stride, key/value stride and heads (None for the last block): what
            ``'handoff'`` may shrink before handing the scores on.
        fused: the fused path (True) or the explicit reference (False).
    """

    def __init__(self, dim: int, dim_out: int, num_heads: int, *, qkv_bias: bool = True,
                 pool_kernel: Optional[Pair] = None, stride_q: Pair = (1, 1), stride_kv: Pair = (1, 1),
                 rel_pos_size: Optional[int] = None, residual_pooling: bool = False, norm_eps: float = 1e-6,
                 score_memory: str = 'full', next_block: Optional[Tuple[Pair, Pair, int]] = None, fused: bool = True):
        super().__init__()
        self.score_memory = check_score_memory(score_memory, SCORE_MEMORY, type(self).__name__)
        if score_memory == 'factors' and (pool_kernel is not None or rel_pos_size is not None):
            raise ValueError("score_memory='factors' needs attention without pooling and relative positions (plain "
                             "ViT blocks, as in ReViT); MViTv2 blocks take 'full' or 'handoff'")
        self.fused = fused
        self.num_heads = num_heads
        self.dim_out = dim_out
        head_dim = dim_out // num_heads
        self.scale = head_dim ** -0.5
        self.stride_q = tuple(stride_q)
        self.stride_kv = tuple(stride_kv)
        self.residual_pooling = residual_pooling
        # how the previous scores reach this block's grids (the parity builder puts the official code's here)
        self.align = align_pooled_by_position
        self.next_block = next_block
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

    def forward(self, x: Tensor, residual: Union[PooledScores, ScoreFactors, None],
                alpha: Union[Tensor, float]) -> Tuple[Tensor, Union[PooledScores, ScoreFactors]]:
        """x: (B, H, W, dim) -> (B, H_q, W_q, dim_out), plus the mixed scores (with relative positions) to carry.

        ``residual``: the previous layer's scores and grids, None in the first layer; with
        ``score_memory='factors'`` the carried factors (empty ones in the first layer), and factors are returned.
        """
        B, H, W, _ = x.shape
        # One copy into (3, B, heads, N, d): the score products then read q, k and v as they lie, where a batched
        # matmul over the permuted projection copies its operands in every product once B > 1.
        q, k, v = self.qkv(x).reshape(B, H * W, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4).contiguous()
        if self.score_memory == 'factors':
            x, carried = factored_attention(q * self.scale, k, v, (H, W), residual, alpha, self.fused)
            q_size = (H, W)
        else:
            q, q_size = self._pool(q, (H, W), self.pool_q, self.norm_q)
            k, kv_size = self._pool(k, (H, W), self.pool_k, self.norm_k)
            v, _ = self._pool(v, (H, W), self.pool_v, self.norm_v)
            x, carried = self._attend(q, k, v, q_size, kv_size, residual, alpha)
        if self.residual_pooling:
            x = x + q
        x = x.transpose(1, 2).reshape(B, *q_size, self.dim_out)
        return self.proj(x), carried

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, q_size: Pair, kv_size: Pair,
                residual: Optional[PooledScores], alpha: Union[Tensor, float]) -> Tuple[Tensor, PooledScores]:
        # this block's input is the previous block's query grid; strides accumulate from there
        source = TokenGrid(0, 0) if residual is None else residual.source_q_grid or residual.q_grid
        in_h, in_w = source.stride_h, source.stride_w
        q_grid = TokenGrid(*q_size, in_h * self.stride_q[0], in_w * self.stride_q[1])
        kv_grid = TokenGrid(*kv_size, in_h * self.stride_kv[0], in_w * self.stride_kv[1])
        rel = None if self.rel_pos_h is None else decomposed_rel_pos_terms(q, q_size, kv_size, self.rel_pos_h,
                                                                           self.rel_pos_w)
        if self.score_memory == 'full':
            prev = None if residual is None else self.align(residual, q_grid, kv_grid, self.num_heads)
            x, scores = residual_attention(q, k, v, prev, alpha, scale=self.scale, rel=rel, fused=self.fused)
            return x, PooledScores(scores, q_grid, kv_grid)
        prev = prev_kv_grid = None
        if residual is not None and residual.q_grid == q_grid and residual.scores.shape[1] in (1, self.num_heads):
            # already on this query grid (handed on shrunk): only its keys may still need repeating onto this key
            # grid, which each row chunk does for itself
            prev, prev_kv_grid = residual.scores, residual.kv_grid
        elif residual is not None:
            prev = self.align(residual, q_grid, kv_grid, self.num_heads)
        reduction = ScoreReduction.plan(q_grid, kv_grid, self.num_heads, self.next_block)
        x, scores = chunked_attention(q * self.scale, k, v, prev, alpha, *(rel or (None, None)), reduction, kv_grid,
                                      prev_kv_grid, self.fused)
        if reduction.shrinks:
            return x, PooledScores(scores, reduction.q_grid, reduction.kv_grid, q_grid)
        return x, PooledScores(scores, q_grid, kv_grid)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # Checkpoints trained at another resolution carry relative-position tables of another length.
        for name in ('rel_pos_h', 'rel_pos_w'):
            own, table = getattr(self, name), state_dict.get(prefix + name)
            if own is not None and table is not None and table.dim() == 2 and table.shape[0] != own.shape[0]:
                resized = F.interpolate(table.t().unsqueeze(0).float(), size=own.shape[0], mode='linear')
                state_dict[prefix + name] = resized.squeeze(0).t().to(table.dtype)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


class ResidualAttentionBlock(nn.Module):
    """Pre-norm transformer block with residual (pooling) attention: a ViT block, or an MViTv2 block with pooling.

    Where the width changes (MViTv2 changes it inside attention), the shortcut is a linear projection of the
    *normalised* input; where queries are strided, the shortcut is max-pooled with kernel stride + 1 (both as in
    MViTv2). ``attn_kwargs`` go to :class:`PoolingResidualAttention`.
    """

    def __init__(self, dim: int, dim_out: int, num_heads: int, *, mlp_ratio: float = 4., drop_path: float = 0.,
                 **attn_kwargs):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = PoolingResidualAttention(dim, dim_out, num_heads, **attn_kwargs)
        self.shortcut_proj = nn.Linear(dim, dim_out) if dim != dim_out else None
        stride_q = self.attn.stride_q
        if math.prod(stride_q) > 1:
            kernel = [s + 1 if s > 1 else s for s in stride_q]
            self.shortcut_pool = nn.MaxPool2d(kernel, stride_q, [k // 2 for k in kernel])
        else:
            self.shortcut_pool = None
        self.drop_path = DropPath(drop_path) if drop_path > 0. else nn.Identity()
        self.norm2 = nn.LayerNorm(dim_out, eps=1e-6)
        self.mlp = Mlp(dim_out, int(dim_out * mlp_ratio), act_layer=nn.GELU)

    def forward(self, x: Tensor, residual: Union[PooledScores, ScoreFactors, None],
                alpha: Union[Tensor, float]) -> Tuple[Tensor, Union[PooledScores, ScoreFactors]]:
        """x: (B, H, W, C) -> (B, H_q, W_q, C_out), plus what this layer carries on (see the attention)."""
        x_norm = self.norm1(x)
        out, scores = self.attn(x_norm, residual, alpha)
        shortcut = x if self.shortcut_proj is None else self.shortcut_proj(x_norm)
        if self.shortcut_pool is not None:
            shortcut = self.shortcut_pool(shortcut.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
        x = shortcut + self.drop_path(out)
        x = x + self.drop_path(self.mlp(self.norm2(x)))
        return x, scores
