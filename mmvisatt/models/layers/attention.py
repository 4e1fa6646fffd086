"""The attention primitive every family calls, and the one switch between its two paths.

``fused_attn`` picks ``scaled_dot_product_attention`` (True) or the explicit softmax reference (False). A
backbone's ``fused_attn=None`` takes timm's global setting (:func:`timm.layers.use_fused_attn`: on wherever
PyTorch has the kernel; ``TIMM_FUSED_ATTN=0`` or :func:`timm.layers.set_fused_attn` turn it off for timm's models
and ours alike).
"""
from typing import Optional

import torch.nn.functional as F
from timm.layers import use_fused_attn
from torch import Tensor


def resolve_fused_attn(fused_attn: Optional[bool]) -> bool:
    """A backbone's ``fused_attn`` argument as a bool: ``None`` takes the global setting."""
    return use_fused_attn() if fused_attn is None else bool(fused_attn)


def attention(q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor] = None, scale: Optional[float] = None,
              dropout: float = 0., fused: bool = True) -> Tensor:
    """``softmax(scale * q k^T + bias) v`` over the last two dims.

    q: (..., N_q, d); k: (..., N_k, d); v: (..., N_k, d_v); the leading dims are batch dims ((B, heads), or more,
    e.g. (B, windows, heads)); bias: additive, broadcastable to (..., N_q, N_k); ``scale`` defaults to
    ``d ** -0.5`` (pass 1.0 for pre-scaled keys). Returns (..., N_q, d_v). The explicit path scales q before the
    product, as the reference implementations do; ``dropout`` is the probability on the attention weights.
    """
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if bias is not None:
        bias = bias.to(q.dtype)
    if not fused:
        scores = (q * scale) @ k.transpose(-2, -1)
        if bias is not None:
            scores = scores + bias
        attn = scores.softmax(dim=-1)
        if dropout:
            attn = F.dropout(attn, dropout)
        return attn @ v
    if q.dim() > 4:
        # the fused kernels take (batch, heads, N, d): more leading dims join the batch (views), and so does a
        # bias that varies along them
        lead = q.shape[:-3]
        q, k, v = (t.flatten(0, len(lead) - 1) for t in (q, k, v))
        if bias is not None and bias.dim() > 3:
            bias = bias.reshape((1, ) * (len(lead) + 3 - bias.dim()) + tuple(bias.shape))
            bias = bias.expand(*lead, *bias.shape[-3:]).flatten(0, len(lead) - 1)
        return attention(q, k, v, bias, scale, dropout).unflatten(0, lead)
    if bias is not None and bias.dim() < 4:
        # a mask of fewer dims sends PyTorch's CPU flash kernel to its slow math fallback
        bias = bias.reshape((1, ) * (4 - bias.dim()) + tuple(bias.shape))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout, scale=scale)
