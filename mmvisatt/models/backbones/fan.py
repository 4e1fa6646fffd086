"""FAN: Fully Attentional Networks (Zhou et al., "Understanding The Robustness in Vision Transformers", ICML 2022).

A FAN block replaces the transformer MLP by an efficient channel attention (:class:`EfficientChannelAttention`):
token attention mixes the tokens, then every channel is gated by a statistic of the whole image. The paper builds
three forms, one class and file each (``fan_vit.py``, ``fan_hybrid.py``, ``fan_swin.py``):

- ``vit``: a 4-conv stride-16 stem, Fourier position encoding and FAN blocks (a plain, single-scale ViT; dense
  tasks get ViTDet's simple feature pyramid);
- ``hybrid``: two ConvNeXt stages (strides 4 and 8) as the stem, then FAN blocks at stride 16; the official
  detection layout returns the two ConvNeXt maps, the output of one FAN block, and a stride-2 convolution of
  the patch tokens after the class-attention head (stride 32);
- ``swin``: Swin with the channel attention in place of the MLP in stages 1-3.

The efficient channel attention (the paper's Eq. 7) gives every channel one gate from the whole image and
multiplies it onto a value branch. Per head of ``d`` channels, with ``x`` the (normalised) input tokens::

    q_hat = softmax_over_tokens(W_q x)                       (N, d)
    k_hat = mean_over_the_head's_channels(softmax_over_tokens(x))   (N, 1)   # no key projection
    gate  = temperature_head * sigmoid(q_hat^T k_hat)         (d,)     # no 1/sqrt(d) scaling
    out   = gate * LayerNorm(value_mlp(x))                    broadcast over tokens

``q_hat`` and ``k_hat`` are distributions over the N tokens, so the sigmoid's argument is about 1/N: the gate
sits near 0.5 plus a small input-dependent term and ``temperature`` carries most of its scale.

This file holds what the three forms share (the two attentions, the FAN and class-attention blocks, the presets,
the base classes and the checkpoint converter). Numerical quirks of the official code that its
weights depend on are reproduced (``docs/fan.md``).
"""
import inspect
import math
import re
import warnings
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
from mmcv.cnn import build_norm_layer
from mmengine.registry import MODELS
from timm.layers import DropPath, Mlp, trunc_normal_
from torch import Tensor

from mmvisatt.checkpoint import register_converter
from mmvisatt.checkpoint.renames import final_norm_key, rename_release, swin_layer_key
from ..layers.attention import attention, resolve_fused_attn
from ..layers.checkpoint import checkpoint
from ..layers.helpers import check_choice
from ..layers.patch import map_to_tokens, tokens_to_map
from ..layers.window import WindowAttention
from .base import AttentionBackbone, LayerOrder, init_transformer_weights

Size = Tuple[int, int]


# ---------------------------------------------------------------------------------------------------------
# Token attention and efficient channel attention
# ---------------------------------------------------------------------------------------------------------
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


# ---------------------------------------------------------------------------------------------------------
# Position encoding
# ---------------------------------------------------------------------------------------------------------
class FourierPositionEncoding(nn.Module):
    """Sine/cosine encoding of normalised (y, x) coordinates, projected to ``dim`` channels by a 1x1 conv.

    Coordinates run 1..H and 1..W, divided by (last + 1e-6) and scaled by 2*pi; each axis gets ``hidden_dim``
    slots, sin on even and cos on odd ones, laid out [y-slots, x-slots]. Frequencies are
    ``temperature ** (2 * floor(i / 2) / hidden_dim)`` (``exponent='paired'``, the classifier's) or
    ``temperature ** (i / hidden_dim)`` (``'linear'``, what FAN's detection and segmentation code computes by
    dropping the floor). The grid is always built in float32 and cast to the projection's dtype, like the
    official module, so float64 runs reproduce its numbers.
    """

    def __init__(self, dim: int, hidden_dim: int = 32, temperature: int = 10000, exponent: str = 'paired'):
        super().__init__()
        self.exponent = check_choice('exponent', exponent, ('paired', 'linear'))
        self.hidden_dim = hidden_dim
        self.temperature = temperature
        self.proj = nn.Conv2d(2 * hidden_dim, dim, 1)

    def _encode(self, length: int, freqs: Tensor) -> Tensor:
        coord = torch.arange(1, length + 1, dtype=torch.float32, device=freqs.device)
        coord = coord / (coord[-1:] + 1e-6) * (2 * math.pi)
        phase = coord[:, None] / freqs
        return torch.stack([phase[:, 0::2].sin(), phase[:, 1::2].cos()], dim=2).flatten(1)

    def forward(self, size: Size) -> Tensor:
        """(H, W) -> (1, H * W, dim)."""
        H, W = size
        i = torch.arange(self.hidden_dim, dtype=torch.float32, device=self.proj.weight.device)
        half = torch.div(i, 2, rounding_mode='floor') if self.exponent == 'paired' else i / 2
        freqs = self.temperature ** (2 * half / self.hidden_dim)
        y = self._encode(H, freqs)[:, None, :].expand(H, W, -1)
        x = self._encode(W, freqs)[None, :, :].expand(H, W, -1)
        grid = torch.cat([y, x], dim=-1).permute(2, 0, 1)[None].to(self.proj.weight.dtype)
        return self.proj(grid).flatten(2).transpose(1, 2)


# ---------------------------------------------------------------------------------------------------------
# Blocks
# ---------------------------------------------------------------------------------------------------------
class FANBlock(nn.Module):
    """x += gamma1 * TokenAttention(LN(x)); x += gamma2 * EfficientChannelAttention(LN(x))."""

    def __init__(self, dim: int, num_heads: int, *, mlp_ratio: float = 4., qkv_bias: bool = True, drop: float = 0.,
                 attn_drop: float = 0., drop_path: float = 0., eta: float = 1., fused: bool = True,
                 norm_layer: Callable[[int], nn.Module] = nn.BatchNorm2d):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = TokenAttention(dim, num_heads, qkv_bias, attn_drop, drop, fused)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.channel_attn = EfficientChannelAttention(dim, num_heads, int(dim * mlp_ratio), qkv_bias=qkv_bias,
                                                      attn_drop=attn_drop, drop=drop, value_residual=True,
                                                      norm_layer=norm_layer)
        self.gamma1 = nn.Parameter(torch.full((dim, ), float(eta)))
        self.gamma2 = nn.Parameter(torch.full((dim, ), float(eta)))
        self.drop_path = DropPath(drop_path) if drop_path > 0. else nn.Identity()

    def forward(self, x: Tensor, size: Size) -> Tensor:
        """(B, N, C) tokens of an (H, W) = ``size`` grid -> (B, N, C)."""
        x = x + self.drop_path(self.gamma1 * self.attn(self.norm1(x)))
        return x + self.drop_path(self.gamma2 * self.channel_attn(self.norm2(x), size))


class ClassAttention(nn.Module):
    """The class token (first token) queries all tokens, itself included."""

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = True, attn_drop: float = 0.,
                 proj_drop: float = 0., fused: bool = True):
        super().__init__()
        self.num_heads = num_heads
        self.fused = fused
        self.attn_drop = attn_drop
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.k = nn.Linear(dim, dim, bias=qkv_bias)
        self.v = nn.Linear(dim, dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: Tensor) -> Tensor:
        """(B, 1 + N, C) -> (B, 1, C)."""
        B, N, C = x.shape
        h = self.num_heads
        q = self.q(x[:, :1]).reshape(B, 1, h, C // h).transpose(1, 2)
        k = self.k(x).reshape(B, N, h, C // h).transpose(1, 2)
        v = self.v(x).reshape(B, N, h, C // h).transpose(1, 2)
        out = attention(q, k, v, dropout=self.attn_drop if self.training else 0., fused=self.fused)
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(B, 1, C)))


class ClassAttentionBlock(nn.Module):
    """FAN's class-attention block (the XCiT form).

    Patch tokens take ``+ gamma1 * LN1(x)`` in the attention step and, with ``tokens_norm``, are normalised and
    then added to themselves in the MLP step (they leave as 2 * LN2(.)). That is what the released weights and
    the official detection output were trained with, so it is kept as is.
    """

    def __init__(self, dim: int, num_heads: int, *, mlp_ratio: float = 4., qkv_bias: bool = True, drop: float = 0.,
                 attn_drop: float = 0., eta: float = 1., tokens_norm: bool = True, fused: bool = True):
        super().__init__()
        self.tokens_norm = tokens_norm
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = ClassAttention(dim, num_heads, qkv_bias, attn_drop, drop, fused)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=nn.GELU, drop=drop)
        self.gamma1 = nn.Parameter(torch.full((dim, ), float(eta)))
        self.gamma2 = nn.Parameter(torch.full((dim, ), float(eta)))

    def forward(self, x: Tensor) -> Tensor:
        """(B, 1 + N, C) -> (B, 1 + N, C), class token first."""
        u = self.norm1(x)
        x = x + self.gamma1 * torch.cat([self.attn(u), u[:, 1:]], dim=1)
        x = self.norm2(x) if self.tokens_norm else torch.cat([self.norm2(x[:, :1]), x[:, 1:]], dim=1)
        return x + torch.cat([self.gamma2 * self.mlp(x[:, :1]), x[:, 1:]], dim=1)


# ---------------------------------------------------------------------------------------------------------
# The backbone
# ---------------------------------------------------------------------------------------------------------
def _vit(dim: int, depth: int, heads: int) -> dict:
    return dict(form='vit', embed_dims=dim, depth=depth, num_heads=heads)


def _hybrid(dim: int, depth: int, heads: int, stem_depths: Sequence[int], out_block: int) -> dict:
    # out_block: the FAN block whose output is the stride-16 map in the official detection backbones
    return dict(form='hybrid', embed_dims=dim, depth=depth, num_heads=heads, stem_depths=tuple(stem_depths),
                stem_dims=(128, 256), out_block=out_block, down_channels=768)


def _swin(dim: int, depths: Sequence[int], heads: Sequence[int]) -> dict:
    return dict(form='swin', embed_dims=dim, depths=tuple(depths), num_heads=tuple(heads),
                channel_attn=(True, True, True, False))


FORMS = ('vit', 'hybrid', 'swin')
# what forward returns: 'featmap' (the dense levels) or the features the official linear head reads
OUT_TYPES = {'vit': ('featmap', 'cls_token'), 'hybrid': ('featmap', 'cls_token'), 'swin': ('featmap', 'avg_featmap')}


class FANBase(AttentionBackbone):
    """Fully Attentional Networks as a dense backbone (NCHW maps at strides 4/8/16/32): what the three forms
    :class:`FANViT`, :class:`FANHybrid` and :class:`FANSwin` share (presets, arch names, outputs, init).
    Arguments below are marked with the forms they apply to where not all.

    Args:
        arch: a preset, ``'{form}_{size}'`` with form ``vit``/``hybrid``/``swin`` and size ``t``/``s``/``b``/``l``
            (also ``'fan_hybrid_s'``, ``'hybrid_small'`` or the official timm names such as
            ``'fan_small_12_p4_hybrid'``), a bare size together with ``form``, or a dict: ``form``,
            ``embed_dims``, ``num_heads`` and ``depth`` (vit, hybrid; hybrid also ``stem_depths``, ``stem_dims``
            and optional ``out_block``, ``down_channels``) or ``depths`` (swin; optional ``channel_attn``, one
            bool per stage).
        form: selects the form when ``arch`` is a bare size.
        out_indices: levels returned, 0..3 = strides 4/8/16/32. ``num_features`` gives their widths:
            vit ``[C/4, C/2, C, C]`` (simple feature pyramid on the last FAN block), hybrid
            ``[stem_dims[0], stem_dims[1], C, down_channels]`` (the official detection layout: ConvNeXt maps,
            FAN block ``out_block``, a new 3x3 stride-2 conv on the tokens after the class-attention head),
            swin ``[C, 2C, 4C, 8C]``.
        feat_downsample (hybrid): True (default): level 3 is the detection layout's stride-32 conv.
            False: the official segmentation layout (``feat_downsample=False`` there), level 3 is the patch
            tokens after the class-attention head themselves, at stride 16 with C channels.
        out_norms: pass every output through its own LayerNorm (``norm{i}``; Swin's ``norm3`` is the official
            final norm). The official detection backbone has none; turn off to reproduce it.
        out_type: ``'featmap'`` (default): the dense levels above. ``'cls_token'`` (vit, hybrid) or
            ``'avg_featmap'`` (swin): a 1-tuple with the (B, C) features the official linear head reads (the
            normalised class token after the class-attention blocks; the mean of the normalised last Swin stage),
            for mmpretrain's ``ImageClassifier`` with ``neck=None`` and ``LinearClsHead(in_channels=C)``. These
            build exactly the official classifier's modules, so ``out_indices``, ``out_norms`` and
            ``classifier`` are ignored (Swin keeps ``norm3``, the official final norm; no dense extras).
        classifier (vit, hybrid): also build the class-attention head's final norm (``cls_norm``) for
            :meth:`forward_classifier` (vit/hybrid; the class-attention blocks are built whenever needed).
        pos_exponent (vit, hybrid): ``'paired'`` (the classifier's Fourier frequencies) or ``'linear'`` (the
            frequencies of the official detection/segmentation code, which differ from those its pretrained
            projection saw).
        fused_attn: ``scaled_dot_product_attention`` (True) or the explicit softmax reference (False, the parity
            oracle); None takes the global default (:mod:`~mmvisatt.models.layers.attention`).
        norm_cfg: the BatchNorm of the ViT stem and of the channel attention's depthwise convs
            (``dict(type='SyncBN')`` as in the official detection recipe).
        eta, cls_attn_layers, cls_tokens_norm (vit, hybrid): initial layer scale of the FAN and class-attention
            blocks; the class-attention head. window_size, patch_size (swin): Swin windows and patches.
        drop_path_rate: the same rate in every FAN block (official) or linearly rising over Swin blocks.
        frozen_stages: -1 none; 0 the stem (and position encoding); n > 0 also the first n FAN blocks (vit,
            hybrid) or Swin stages.
        norm_eval, with_cp, init_cfg: as in every mmvisatt backbone.
    """
    arch_zoo: Dict[str, dict] = {
        'vit_t': _vit(192, 12, 4),
        'vit_s': _vit(384, 12, 8),
        'vit_b': _vit(448, 18, 8),
        'vit_l': _vit(480, 24, 10),
        'hybrid_t': _hybrid(192, 8, 8, (3, 3), 7),
        'hybrid_s': _hybrid(384, 10, 8, (3, 3), 9),
        'hybrid_b': _hybrid(448, 16, 8, (3, 3), 15),
        'hybrid_l': _hybrid(480, 22, 10, (3, 5), 18),
        'swin_t': _swin(96, (2, 2, 6, 2), (3, 6, 12, 24)),
        'swin_s': _swin(96, (2, 2, 18, 2), (3, 6, 12, 24)),
        'swin_b': _swin(128, (2, 2, 18, 2), (4, 8, 16, 32)),
        'swin_l': _swin(192, (2, 2, 18, 2), (6, 12, 24, 48)),
    }
    _arch_keys = ('form', 'embed_dims', 'num_heads')
    _arch_prefix = 'fan'
    _arch_aliases = {
        **{f'{form}_{name}': f'{form}_{name[0]}' for form in FORMS for name in ('tiny', 'small', 'base', 'large')},
        'tiny_12_p16_224': 'vit_t', 'small_12_p16_224': 'vit_s', 'base_18_p16_224': 'vit_b',
        'large_24_p16_224': 'vit_l', 'tiny_8_p4_hybrid': 'hybrid_t', 'small_12_p4_hybrid': 'hybrid_s',
        'base_16_p4_hybrid': 'hybrid_b', 'large_16_p4_hybrid': 'hybrid_l',
        **{f'swin_{n}_patch4_window7_224': f'swin_{n[0]}' for n in ('tiny', 'small', 'base', 'large')},
    }

    form = ''
    _registered_as = 'FAN'
    strides: Tuple[int, ...] = (4, 8, 16, 32)

    def _setup(self, arch: Union[str, dict], form: Optional[str], in_channels: int, out_indices: Sequence[int],
               out_norms: bool, out_type: str, frozen_stages: int, norm_eval: bool, with_cp: bool,
               fused_attn: Optional[bool]) -> dict:
        """What every form sets first; returns the resolved arch."""
        arch = self._resolve_form(arch, form)
        if arch['form'] != self.form:
            raise ValueError(f"arch is a {arch['form']} FAN, not a {self.form} one; build it with "
                             f"{form_classes()[arch['form']].__name__}")
        self.arch = arch
        if out_type not in OUT_TYPES[self.form]:
            raise ValueError(f"out_type '{out_type}' is not available for a {self.form} FAN; choose one of "
                             f"{OUT_TYPES[self.form]}")
        self.out_type = out_type
        if out_type == 'avg_featmap':
            out_indices, out_norms = (3, ), True
        elif out_type == 'cls_token':
            out_indices, out_norms = (), False
        self._set_interface(in_channels, out_indices, 4, frozen_stages, norm_eval)
        self.out_norms = out_norms
        self.with_cp = with_cp
        self.fused_attn = resolve_fused_attn(fused_attn)
        return arch

    @classmethod
    def _resolve_form(cls, arch: Union[str, dict], form: Optional[str]) -> dict:
        if form is not None:
            check_choice('form', form, FORMS)
        if form is not None and isinstance(arch, str):
            key = arch.lower().replace('-', '_')
            key = key[len('fan_'):] if key.startswith('fan_') else key
            arch = key if key.startswith(FORMS) or key in cls._arch_aliases else f'{form}_{key}'
        elif form is not None and 'form' not in arch:
            arch = {**arch, 'form': form}
        arch = cls._resolve_arch(arch)
        if form is not None and arch['form'] != form:
            raise ValueError(f"arch is a {arch['form']} FAN but form='{form}'")
        check_choice('arch form', arch['form'], FORMS)
        needed = {'vit': ('depth', ), 'hybrid': ('depth', 'stem_depths', 'stem_dims'), 'swin': ('depths', )}
        missing = [k for k in needed[arch['form']] if k not in arch]
        if missing:
            raise ValueError(f"a {arch['form']} FAN arch dict needs {missing}")
        return arch

    @classmethod
    def _resolve_arch(cls, arch: Union[str, dict]) -> dict:
        if isinstance(arch, str):
            key = arch.lower().replace('-', '_')
            key = key[len('fan_'):] if key.startswith('fan_') else key
            return super()._resolve_arch(cls._arch_aliases.get(key, key))
        return super()._resolve_arch(arch)

    def _init_module(self, m: nn.Module) -> None:
        """The official initialisation of what FAN adds to a transformer: He-normal (fan-out) depthwise convs in
        the channel attention's MLP, Swin position tables."""
        if isinstance(m, ConvValueMlp):
            for conv in (m.dwconv.conv1, m.dwconv.conv2):
                fan_out = conv.kernel_size[0] * conv.kernel_size[1] * conv.out_channels // conv.groups
                nn.init.normal_(conv.weight, 0, math.sqrt(2.0 / fan_out))
                nn.init.zeros_(conv.bias)
        elif isinstance(m, WindowAttention):
            trunc_normal_(m.relative_position_bias_table, std=.02)

    def _default_init(self):
        init_transformer_weights(self, self._init_module)
        if getattr(self, 'cls_token', None) is not None:
            trunc_normal_(self.cls_token, std=.02)

    def _level(self, i: int, x: Tensor, height: int, width: int) -> Tensor:
        """Crop an NCHW level to ceil(H / stride) x ceil(W / stride) and apply its output norm."""
        stride = self.strides[i]
        # integer ceil: a float of the sizes would be a symbolic float under torch.compile(dynamic=True)
        x = x[..., :(height + stride - 1) // stride, :(width + stride - 1) // stride]
        return self._output(i, x.permute(0, 2, 3, 1)) if self.out_norms else x.contiguous()

    def forward(self, x: Tensor) -> Tuple[Tensor, ...]:
        """(B, C_in, H, W) -> tuple of (B, num_features[i], ceil(H / s_i), ceil(W / s_i)), s = ``strides``
        (4/8/16/32; 4/8/16/16 with ``feat_downsample=False``); with a classifier ``out_type``, a 1-tuple of the
        (B, C) features of the official head."""
        if self.out_type != 'featmap':
            return (self.forward_classifier(x), )
        self._check_input(x)
        return self._forward_dense(x)


class _TokenFAN(FANBase):
    """What FAN-ViT and FAN-Hybrid share: FAN blocks on a stem's tokens, the class-attention head, the
    classifier output and the layer order; each form builds its stem and dense levels."""
    _stem = ('patch_embed', 'pos_embed')
    _frozen_units = 'blocks'
    _stage_norms = False  # the output norms belong to the dense levels

    def _build_tokens(self, arch: dict, stem: nn.Module, *, mlp_ratio: float, qkv_bias: bool, drop_rate: float,
                      attn_drop_rate: float, drop_path_rate: float, eta: float, cls_attn_layers: int,
                      cls_tokens_norm: bool, classifier: bool, class_attention: bool, pos_exponent: str,
                      bn: Callable[[int], nn.Module]) -> None:
        """The stem (built by the form), Fourier position encoding, FAN blocks and, where ``classifier`` or
        ``class_attention`` (a dense level reads it), the class-attention head."""
        dim, heads, depth = arch['embed_dims'], arch['num_heads'], arch['depth']
        self.patch_size = 16  # the token stride, and the smallest input side accepted
        self.patch_embed = stem
        self.pos_embed = FourierPositionEncoding(dim, exponent=pos_exponent)
        self.pos_drop = nn.Dropout(drop_rate)
        self.blocks = nn.ModuleList([
            FANBlock(dim, heads, mlp_ratio=mlp_ratio, qkv_bias=qkv_bias, drop=drop_rate, attn_drop=attn_drop_rate,
                     drop_path=drop_path_rate, eta=eta, fused=self.fused_attn, norm_layer=bn) for _ in range(depth)
        ])
        self.out_block = arch.get('out_block', depth - 1) % depth
        self.cls_token = self.cls_attn_blocks = self.cls_norm = None
        if classifier or class_attention:
            self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
            self.cls_attn_blocks = nn.ModuleList([
                ClassAttentionBlock(dim, heads, mlp_ratio=mlp_ratio, qkv_bias=qkv_bias, drop=drop_rate,
                                    attn_drop=attn_drop_rate, eta=eta, tokens_norm=cls_tokens_norm,
                                    fused=self.fused_attn) for _ in range(cls_attn_layers)
            ])
        if classifier:
            self.cls_norm = nn.LayerNorm(dim, eps=1e-6)

    def _run_blocks(self, x: Tensor) -> Tuple[Tensor, Size, List[Tensor], Tensor]:
        """Stem, position encoding and FAN blocks: tokens after the last block, their grid, the stem maps and
        the tokens after block ``out_block``."""
        x, size, maps = self.patch_embed(x)
        x = self.pos_drop(x + self.pos_embed(size))
        out_block_tokens = x
        for i, block in enumerate(self.blocks):
            x = checkpoint(block, x, size, enabled=self.with_cp)
            if i == self.out_block:
                out_block_tokens = x
        return x, size, maps, out_block_tokens

    def _class_attention(self, x: Tensor) -> Tensor:
        """(B, N, C) patch tokens -> (B, 1 + N, C) after the class-attention blocks, class token first."""
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        for block in self.cls_attn_blocks:
            x = block(x)
        return x

    def _forward_dense(self, x: Tensor) -> Tuple[Tensor, ...]:
        H, W = x.shape[-2:]
        levels = self._dense_levels(*self._run_blocks(x))
        return tuple(self._level(i, levels[i], H, W) for i in self.out_indices)

    def forward_classifier(self, x: Tensor) -> Tensor:
        """(B, C_in, H, W) -> (B, C): the normalised class token (needs ``out_type='cls_token'`` or
        ``classifier=True``)."""
        self._check_input(x)
        if self.cls_norm is None:
            raise RuntimeError("forward_classifier needs FAN(..., out_type='cls_token') or classifier=True")
        tokens = self._run_blocks(x)[0]
        return self.cls_norm(self._class_attention(tokens))[:, 0]

    def _stem_layer_order(self) -> LayerOrder:
        yield 'patch_embed', False

    def _layer_order(self) -> LayerOrder:
        yield from self._stem_layer_order()
        yield 'pos_embed', False
        yield from ((f'blocks.{i}', True) for i in range(len(self.blocks)))
        if self.cls_attn_blocks is not None:
            # the class-attention head is one layer after the blocks (as timm groups XCiT's)
            yield from (('cls_token', True), ('cls_attn_blocks', False), ('cls_norm', False))


def form_classes() -> Dict[str, type]:
    """FAN's class per form: ``{'vit': FANViT, 'hybrid': FANHybrid, 'swin': FANSwin}`` (imported when asked:
    their files import this one)."""
    from .fan_hybrid import FANHybrid
    from .fan_swin import FANSwin
    from .fan_vit import FANViT
    return {'vit': FANViT, 'hybrid': FANHybrid, 'swin': FANSwin}


@MODELS.register_module(name='FAN')
def FAN(arch: Union[str, dict] = 'hybrid_s', form: Optional[str] = None, **kwargs) -> FANBase:  # noqa: N802
    """Deprecated: build the FAN form ``arch`` names (``type='FAN'`` in configs written before the forms had a
    class each). Configs name the form's class: ``FANViT``, ``FANHybrid`` or ``FANSwin``.

    An argument the form does not have is dropped when it holds the value it defaults to in the forms that have
    it (e.g. ``classifier=False`` for Swin, so one config can switch forms), and is an error otherwise that says
    which forms have it. Arguments: :class:`FANBase`.
    """
    forms = form_classes()
    target = forms[FANBase._resolve_form(arch, form)['form']]
    warnings.warn(f"type='FAN' is deprecated: write type='{target.__name__}' (the {target.form} form's class) in "
                  f"the backbone config; its arguments are the same", DeprecationWarning, stacklevel=2)
    accepted = inspect.signature(target.__init__).parameters
    for name in [n for n in kwargs if n not in accepted]:
        owners = {f: c for f, c in forms.items() if name in inspect.signature(c.__init__).parameters}
        defaults = {inspect.signature(c.__init__).parameters[name].default for c in owners.values()}
        if owners and defaults == {kwargs[name]}:
            del kwargs[name]
            continue
        where = (f"exists for the {' and '.join(owners)} form{'s' if len(owners) > 1 else ''} only"
                 if owners else 'is not an argument of any FAN')
        raise ValueError(f"'{name}' {where}, not a {target.form} FAN ({target.__name__})")
    return target(arch, form, **kwargs)


def _build_bn(norm_cfg: dict, channels: int) -> nn.Module:
    return build_norm_layer(norm_cfg, channels)[1]


# ---------------------------------------------------------------------------------------------------------
# Checkpoints: official FAN release files (ViT / hybrid classifiers, detection backbones, Swin), mm-style files.
# ---------------------------------------------------------------------------------------------------------
_OFFICIAL_MARK = re.compile(r'^(layers\.\d+\.)?blocks\.\d+\.mlp\.temperature$')
_MM_MARK = re.compile(r'^(stages\.\d+\.)?blocks\.\d+\.channel_attn\.temperature$')
_CHANNEL_ATTN = re.compile(r'^((?:stages\.\d+\.)?blocks\.\d+)\.mlp\.(temperature|q\.|mlp_v\.|norm_v\.)')


def official_to_mmvisatt_key(key: str) -> str:
    """One official FAN (vit / hybrid / detection) key -> the FAN module's key (without 'backbone.')."""
    key = key.replace('pos_embeder.', 'pos_embed.').replace('pos_embed.token_projection.', 'pos_embed.proj.')
    key = key.replace('patch_embed.backbone.', 'patch_embed.').replace('learnable_downsample.', 'downsample.')
    key = re.sub(r'^norm\.', 'cls_norm.', key)
    return _CHANNEL_ATTN.sub(r'\1.channel_attn.\2', key)


def official_swin_to_mmvisatt_key(key: str, num_stages: int = 4) -> str:
    """One official FAN-Swin key -> the FAN module's key; patch merging moves to the start of the next stage."""
    key = final_norm_key(swin_layer_key(key, merging_at_end=True), num_stages - 1)
    return _CHANNEL_ATTN.sub(r'\1.channel_attn.\2', key)


def _split_fused_class_attention(state_dict: Dict[str, Tensor]) -> Dict[str, Tensor]:
    # XCiT-format class attention with one qkv projection (the official checkpoint_filter_fn handles it too)
    out = {}
    for key, value in state_dict.items():
        m = re.match(r'(cls_attn_blocks\.\d+\.attn\.)qkv\.(weight|bias)$', key)
        if m:
            for name, part in zip('qkv', value.chunk(3, dim=0)):
                out[f'{m.group(1)}{name}.{m.group(2)}'] = part
        else:
            out[key] = value
    return out


def _from_official(state_dict) -> Dict[str, Tensor]:
    state_dict = _split_fused_class_attention(dict(state_dict))
    swin = any(k.startswith('layers.') for k in state_dict)
    return rename_release(state_dict, official_swin_to_mmvisatt_key if swin else official_to_mmvisatt_key)


@register_converter('fan', is_mm=lambda keys: any(_MM_MARK.match(k) for k in keys))
def convert_fan_checkpoint(state_dict: Dict[str, Tensor], prefixed: bool) -> Optional[Tuple[Dict[str, Tensor], str]]:
    """Official FAN (classifier, detection/segmentation backbone, Swin) keys -> mm-style FAN keys.

    The classifier's ``head`` becomes ``head.fc``; buffers Swin rebuilds (``relative_position_index``,
    ``attn_mask``) are dropped.
    """
    keys = set(state_dict)
    if not any(_OFFICIAL_MARK.match(k) for k in keys):
        return None
    if prefixed:
        # an official detection/segmentation model saved by mmdet/mmseg
        return _from_official(state_dict), 'official-fan-dense'
    swin = any(k.startswith('layers.') for k in keys)
    return _from_official(state_dict), 'official-fan-swin' if swin else 'official-fan'
