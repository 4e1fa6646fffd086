"""The lean score path of the ReViT family's attention (the default, ``fused_attn=True``): the residual mix,
relative positions, softmax and ``@ v`` as one autograd function that keeps one score-sized tensor per layer.

Softmax and ``@ v`` run in row chunks of :func:`row_chunks`, each at most a budget of score elements (an argument;
by default :func:`default_chunk_numel` of the device); the backward keeps only the carried scores and q, k, v and
recomputes the softmax chunk by chunk. :class:`ResidualGate` gives the previous scores their
share of the gradient through the (linear) alignment. Forward values are bit-identical to the plain composition
(``PoolingResidualAttention(lean_scores=False)``) wherever a matrix product's rows do not depend on its row count
(one chunk always; several with MKL's AVX kernels, 1 ulp apart with its FMA kernels); gradients equal up to
summation order.
"""
from typing import Optional, Tuple, Union

import torch
from torch import Tensor

from .inplace import add_into


# Score elements per row chunk. On a CPU, 16 MiB of float32: the chunk's softmax stays in the caches of the two
# cores it was tuned on (docs/performance.md). Elsewhere (a GPU) 256 MiB: the chunks bound a temporary's memory,
# and every kernel of a chunk still moves hundreds of megabytes, so launches stay a small share of the time and
# the chunk count grows with the batch only once a batch's scores pass the budget.
CHUNK_NUMEL = {'cpu': 1 << 22}
DEVICE_CHUNK_NUMEL = 1 << 26


def default_chunk_numel(device: torch.device) -> int:
    """The row-chunk budget, in score elements, for tensors on ``device`` (see :data:`CHUNK_NUMEL`)."""
    return CHUNK_NUMEL.get(torch.device(device).type, DEVICE_CHUNK_NUMEL)


def chunk_numel(budget: Optional[int], device: torch.device) -> int:
    """``budget``, or the device's default where it is None."""
    return default_chunk_numel(device) if budget is None else budget


def row_chunks(rows: int, row_numel: int, budget: int):
    """Query-row ranges of at most ``budget`` score elements each (one row when a row alone is larger)."""
    step = max(1, budget // max(row_numel, 1))
    return [(start, min(start + step, rows)) for start in range(0, rows, step)]


def _chunked_dot(a: Tensor, b: Tensor, dtype: torch.dtype, budget: int) -> Tensor:
    """``(a * b).sum()`` of two (B, heads, N, M) tensors without materialising the score-sized product."""
    total = a.new_zeros((), dtype=dtype)
    for start, end in row_chunks(a.shape[-2], a.shape[:-2].numel() * a.shape[-1], budget):
        total = total + torch.sum(a[..., start:end, :] * b[..., start:end, :], dtype=dtype)
    return total


class ResidualGate(torch.autograd.Function):
    """Identity on the previous scores whose backward applies the residual's weight ``keep`` in the mix.

    Only used with :class:`LeanScoreAttention`, which reports the gradient of the *unscaled* aligned residual
    (``keep`` is ``1 - alpha``, or a power of it for a stored map several layers back). The alignment between the
    two is linear, so the gradient arriving here is ``L^T(dR)`` and keep's share of the residual term,
    ``<dR, L(prev)>``, equals ``<L^T(dR), prev>``: ``prev`` is kept alive anyway (by the previous block, or as this
    block's checkpoint input), so no score-sized aligned copy has to be saved for alpha.
    """

    @staticmethod
    def forward(ctx, prev: Tensor, keep: Union[Tensor, float], budget: Optional[int] = None) -> Tensor:
        # a tensor keep goes through save_for_backward: kept on ctx, a non-leaf one would pin its graph
        ctx.keep = None if torch.is_tensor(keep) else keep
        ctx.budget = chunk_numel(budget, prev.device)
        ctx.save_for_backward(prev, keep if torch.is_tensor(keep) else None)
        return prev.view_as(prev)

    @staticmethod
    def backward(ctx, grad: Tensor):
        prev, keep = ctx.saved_tensors
        if keep is None:
            return grad * ctx.keep, None, None
        d_prev = grad * keep if ctx.needs_input_grad[0] else None
        d_keep = None
        if ctx.needs_input_grad[1]:
            d_keep = _chunked_dot(grad, prev, keep.dtype, ctx.budget).reshape(keep.shape)
        return d_prev, d_keep, None


class LeanScoreAttention(torch.autograd.Function):
    """``softmax(R) @ v`` with ``R = alpha * (q_s k^T) + keep * A + rel_h + rel_w``; returns the output and R.

    Plain autograd keeps three score-sized tensors per layer for the backward (``q_s k^T`` and ``A`` for alpha's
    gradient, the softmax output) on top of the carried ``R``. Here only ``R`` is kept (it is carried to the next
    layer anyway): the backward recomputes the softmax from it row chunk by row chunk, and takes alpha's share of
    ``q_s k^T`` as ``<dR @ k, q_s>``. The largest layer's backward then holds ``R``, the incoming gradient of
    ``R`` and the aligned residual's gradient, where plain autograd adds the three saved tensors and two more
    gradients. Forward values are those of :func:`mix_scores` and :func:`add_decomposed_rel_pos`, op for op.

    ``keep`` is ``1 - alpha`` for ReViT's mix. ``aligned`` must come from ``ResidualGate``-wrapped scores (with the
    same ``keep``): its gradient is reported unscaled, and keep's gradient is taken there. ``budget``: score
    elements per row chunk (None: :func:`default_chunk_numel` of the device).
    """

    @staticmethod
    def forward(ctx, q_s: Tensor, k: Tensor, v: Tensor, aligned: Optional[Tensor], alpha: Union[Tensor, float],
                keep: Union[Tensor, float], rel_h: Optional[Tensor], rel_w: Optional[Tensor],
                budget: Optional[int] = None) -> Tuple[Tensor, Tensor]:
        B, heads, Nq, _ = q_s.shape
        Nk = k.shape[-2]
        budget = ctx.budget = chunk_numel(budget, q_s.device)
        scores = q_s @ k.transpose(-2, -1)
        ctx.s_dtype = scores.dtype
        if aligned is not None:
            if not (isinstance(alpha, float) and alpha == 1.0):  # 1.0: the queries carry their weights already
                scores = scores.mul_(alpha) if torch.result_type(scores, alpha) == scores.dtype else alpha * scores
            # chunked so the scaled residual is never a second score-sized temporary
            for a, b in row_chunks(Nq, B * heads * Nk, budget):
                scores[:, :, a:b].add_(keep * aligned[:, :, a:b])
        if rel_h is not None:
            qh, qw, kh, kw = rel_h.shape[2], rel_h.shape[3], rel_h.shape[4], rel_w.shape[4]
            grid = add_into(scores.view(B, heads, qh, qw, kh, kw), rel_h[..., :, None])
            scores = grid.add_(rel_w[..., None, :]).view(B, heads, Nq, Nk)
            ctx.rel_qh, ctx.rel_kw = qh, kw
        out = None
        for a, b in row_chunks(Nq, B * heads * Nk, budget):
            probs = scores[:, :, a:b].softmax(dim=-1)
            part = probs @ v
            if out is None:
                ctx.p_dtype, ctx.o_dtype = probs.dtype, part.dtype
                out = part.new_empty(B, heads, Nq, part.shape[-1])
            out[:, :, a:b] = part
        ctx.alpha = None if torch.is_tensor(alpha) else alpha
        ctx.mixed = aligned is not None
        ctx.aligned_meta = None if aligned is None else (aligned.shape, aligned.dtype)
        ctx.rel_meta = None if rel_h is None else (rel_h.dtype, rel_w.dtype)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(q_s, k, v, scores, alpha if torch.is_tensor(alpha) else None)
        return out, scores

    @staticmethod
    def backward(ctx, d_out: Optional[Tensor], d_scores_in: Optional[Tensor]):
        q_s, k, v, scores, alpha_t = ctx.saved_tensors
        B, heads, Nq, Nk = scores.shape
        budget = ctx.budget
        s_dtype, p_dtype, o_dtype = ctx.s_dtype, ctx.p_dtype, ctx.o_dtype
        k_mm, q_mm, v_mm = k.to(s_dtype), q_s.to(s_dtype), v.to(o_dtype)
        # fp32 accumulators: the chunks are summed here, where autograd sums inside one matmul
        acc = torch.promote_types(s_dtype, torch.float32)
        d_v = torch.zeros(v.shape, dtype=torch.promote_types(o_dtype, torch.float32), device=v.device)
        d_k = torch.zeros(k.shape, dtype=acc, device=k.device)
        g = torch.empty(q_s.shape, dtype=acc, device=q_s.device)
        d_aligned = None
        if ctx.mixed and ctx.needs_input_grad[3]:
            shape, dtype = ctx.aligned_meta
            d_aligned = torch.empty(shape, dtype=dtype, device=scores.device)
        rel = ctx.rel_meta is not None
        if rel:
            kw = ctx.rel_kw
            d_rel_h = scores.new_empty(B, heads, Nq, Nk // kw, dtype=acc)
            d_rel_w = scores.new_empty(B, heads, Nq, kw, dtype=acc)
        for a, b in row_chunks(Nq, B * heads * Nk, budget):
            probs = scores[:, :, a:b].softmax(dim=-1, dtype=p_dtype)
            if d_out is not None:
                d_out_c = d_out[:, :, a:b].to(o_dtype)
                d_v += probs.to(o_dtype).transpose(-2, -1) @ d_out_c
                d_probs = (d_out_c @ v_mm.transpose(-2, -1)).to(p_dtype)
                # softmax backward, in place in the chunk's own buffer
                dot = (d_probs * probs).sum(-1, keepdim=True)
                d_r = d_probs.sub_(dot).mul_(probs).to(scores.dtype)
            else:
                d_r = scores.new_zeros(B, heads, b - a, Nk)
            del probs
            if d_scores_in is not None:
                d_r = add_into(d_r, d_scores_in[:, :, a:b])
            if rel:
                grid = d_r.reshape(B, heads, b - a, Nk // kw, kw)
                d_rel_h[:, :, a:b] = grid.sum(-1, dtype=acc)
                d_rel_w[:, :, a:b] = grid.sum(-2, dtype=acc)
            d_s = d_r.to(s_dtype)
            g[:, :, a:b] = d_s @ k_mm
            d_k += d_s.transpose(-2, -1) @ q_mm[:, :, a:b]
            if d_aligned is not None:
                d_aligned[:, :, a:b] = d_r if d_aligned.shape[1] == heads else d_r.sum(1, keepdim=True)
        alpha = ctx.alpha if alpha_t is None else alpha_t
        d_alpha = None
        if ctx.mixed and alpha_t is not None and ctx.needs_input_grad[4]:
            # alpha's share of alpha * (q_s k^T): <dR, q_s k^T> = <dR @ k, q_s>
            d_alpha = torch.sum(g * q_s, dtype=alpha_t.dtype).reshape(alpha_t.shape)
        if ctx.mixed:
            g = g * alpha
            d_k = d_k * alpha
        d_rel = (None, None)
        if rel:
            qh = ctx.rel_qh
            h_dtype, w_dtype = ctx.rel_meta
            d_rel = (d_rel_h.reshape(B, heads, qh, -1, Nk // kw).to(h_dtype),
                     d_rel_w.reshape(B, heads, qh, -1, kw).to(w_dtype))
        return g.to(q_s.dtype), d_k.to(k.dtype), d_v.to(v.dtype), d_aligned, d_alpha, None, *d_rel, None
