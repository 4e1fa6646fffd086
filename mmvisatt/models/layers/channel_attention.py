"""Attention over tokens and over channels, the two mixers of Fully Attentional Networks (Zhou et al.,
"Understanding The Robustness in Vision Transformers", ICML 2022).

Token attention is multi-head self-attention (:func:`~mmvisatt.models.layers.attention.attention`, fused or
explicit by ``fused``).

The efficient channel attention (the paper's Eq. 7) gives every channel one gate from the whole image and
multiplies it onto a value branch. Per head of ``d`` channels, with ``x`` the (normalised) input tokens::

    q_hat = softmax_over_tokens(W_q x)                       (N, d)
    k_hat = mean_over_the_head's_channels(softmax_over_tokens(x))   (N, 1)   # no key projection
    gate  = temperature_head * sigmoid(q_hat^T k_hat)         (d,)     # no 1/sqrt(d) scaling
    out   = gate * LayerNorm(value_mlp(x))                    broadcast over tokens

``q_hat`` and ``k_hat`` are distributions over the N tokens, so the sigmoid's argument is about 1/N: the gate
sits near 0.5 plus a small input-dependent term and ``temperature`` carries most of its scale.
"""
from typing import Callable, Tuple

import torch
import torch.nn as nn
from torch import Tensor

from .attention import attention
from .patch import map_to_tokens, tokens_to_map


class TokenAttention(nn.Module):
    """Global multi-head self-attention with a query projection ``q`` and a joint key/value projection ``kv``
    (keys are its first ``dim`` outputs, values the last)."""

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = True, attn_drop: float = 0.,
                 proj_drop: float = 0., fused: bool = True):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f'dim {dim} is not divisible by num_heads {num_heads}')
        self.num_heads = num_heads
        self.fused = fused
        self.attn_drop = attn_drop
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.kv = nn.Linear(dim, 2 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: Tensor) -> Tensor:
        """(B, N, C) -> (B, N, C)."""
        B, N, C = x.shape
        h = self.num_heads
        q = self.q(x).reshape(B, N, h, C // h).transpose(1, 2)
        k, v = self.kv(x).reshape(B, N, 2, h, C // h).permute(2, 0, 3, 1, 4)
        out = attention(q, k, v, dropout=self.attn_drop if self.training else 0., fused=self.fused)
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(B, N, C)))


def channel_gate(q: Tensor, k: Tensor, num_heads: int) -> Tensor:
    """The efficient channel attention gate before its temperature: (B, N, C) queries and keys -> (B, heads, d).

    gate[b, h, c] = sigmoid(sum_n softmax_n(q)[n, h, c] * mean_c' softmax_n(k)[n, h, c']).
    """
    B, N, C = q.shape
    q = q.softmax(dim=1).reshape(B, N, num_heads, C // num_heads)
    prototype = k.softmax(dim=1).reshape(B, N, num_heads, C // num_heads).mean(dim=-1)
    return torch.einsum('bnhc,bnh->bhc', q, prototype).sigmoid()


class DepthwiseConvBlock(nn.Module):
    """3x3 depthwise conv -> GELU -> BatchNorm -> 3x3 depthwise conv on tokens laid out as an (H, W) map."""

    def __init__(self, dim: int, norm_layer: Callable[[int], nn.Module] = nn.BatchNorm2d):
        super().__init__()
        self.conv1 = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)
        self.act = nn.GELU()
        self.bn = norm_layer(dim)
        self.conv2 = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)

    def forward(self, x: Tensor, size: Tuple[int, int]) -> Tensor:
        """(B, N, C) with N = H * W (row-major) -> (B, N, C)."""
        x = self.conv2(self.bn(self.act(self.conv1(tokens_to_map(x, size)))))
        return map_to_tokens(x)


class ConvValueMlp(nn.Module):
    """The value branch of the channel attention: fc1 -> (identity +) gamma * depthwise convs -> fc2.

    There is no activation after ``fc1`` (FAN's released models were trained so). ``residual=False`` drops the
    identity around the depthwise convolutions, as FAN's Swin variant does.
    """

    def __init__(self, dim: int, hidden_dim: int, residual: bool = True, drop: float = 0.,
                 norm_layer: Callable[[int], nn.Module] = nn.BatchNorm2d):
        super().__init__()
        self.residual = residual
        self.fc1 = nn.Linear(dim, hidden_dim)
        self.dwconv = DepthwiseConvBlock(hidden_dim, norm_layer)
        self.gamma = nn.Parameter(torch.ones(hidden_dim))
        self.fc2 = nn.Linear(hidden_dim, dim)
        self.drop = nn.Dropout(drop)

    def forward(self, x: Tensor, size: Tuple[int, int]) -> Tensor:
        """(B, N, C) -> (B, N, C)."""
        x = self.fc1(x)
        conv = self.gamma * self.dwconv(x, size)
        x = self.drop(x + conv if self.residual else conv)
        return self.drop(self.fc2(x))


class EfficientChannelAttention(nn.Module):
    """FAN's efficient channel attention: a per-channel, per-image gate times a normalised value branch.

    Args:
        dim: channels. num_heads: heads of the gate (``temperature`` has one entry per head).
        hidden_dim: width of the value MLP. qkv_bias: bias of the query projection.
        attn_drop: dropout on the gate. drop: dropout in the value MLP.
        value_residual: identity around the value MLP's depthwise convs (see :class:`ConvValueMlp`).
        value_norm_eps: eps of the value LayerNorm (1e-5 in FAN's released models, while its other norms use
            1e-6).
        norm_layer: the normalisation between the depthwise convs (BatchNorm2d, or SyncBatchNorm).
    """

    def __init__(self, dim: int, num_heads: int, hidden_dim: int, *, qkv_bias: bool = True, attn_drop: float = 0.,
                 drop: float = 0., value_residual: bool = True, value_norm_eps: float = 1e-5,
                 norm_layer: Callable[[int], nn.Module] = nn.BatchNorm2d):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f'dim {dim} is not divisible by num_heads {num_heads}')
        self.num_heads = num_heads
        self.temperature = nn.Parameter(torch.ones(num_heads, 1, 1))
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.mlp_v = ConvValueMlp(dim, hidden_dim, value_residual, drop, norm_layer)
        self.norm_v = nn.LayerNorm(dim, eps=value_norm_eps)
        self.attn_drop = nn.Dropout(attn_drop)

    def gate(self, x: Tensor) -> Tensor:
        """(B, N, C) -> (B, 1, C): the per-channel gate, temperature included."""
        gate = channel_gate(self.q(x), x, self.num_heads) * self.temperature.view(1, self.num_heads, 1)
        return self.attn_drop(gate).flatten(1).unsqueeze(1)

    def forward(self, x: Tensor, size: Tuple[int, int]) -> Tensor:
        """(B, N, C) tokens of an (H, W) = ``size`` map -> (B, N, C)."""
        return self.norm_v(self.mlp_v(x, size)) * self.gate(x)
