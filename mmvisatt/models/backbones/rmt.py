"""RMT: Retentive Networks Meet Vision Transformers (Fan et al., CVPR 2024, arXiv 2309.11523).

Manhattan Self-Attention (MaSA) biases each head's attention by ``|dy| + |dx|`` times the head's ``log gamma``
(:mod:`mmvisatt.models.layers.spatial_decay`). Early stages decompose it into attention along the width, then
along the height of the width-attended values. Beyond the paper this follows the released code (qhfan/RMT,
``classfication_release/RMT.py``): a rotary phase on q and k from the 1-D raster index ``y * W + x``, a 3x3
depthwise position conv before every block (CPE), a 5x5 depthwise conv of the values added to the attention
output (LCE), a 4-conv stem, per-preset decomposition (RMT-T decomposes only stages 1-2) and layer scale in
stages 3-4 of RMT-B/L. Dense outputs get a LayerNorm each, as the official detection code's ``extra_norms``.
"""
import re
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
from mmengine.logging import print_log
from mmengine.registry import MODELS
from torch import Tensor

from mmvisatt.checkpoint import register_converter
from ..layers.attention import attention
from ..layers.checkpoint import checkpoint_seq
from ..layers.spatial_decay import ConvDownsample, ConvStem, RetentiveBlock, SpatialDecay
from .base import DecayBackbone


class RasterRotary(nn.Module):
    """The rotary phase of the RMT code: interleaved (GPT-J style) pairs rotated by ``n * theta_i``, with ``n`` the
    raster index ``y * W + x`` (so the vertical phase step depends on the width) and
    ``theta_i = 10000 ** -linspace(0, 1, d / 2)`` (endpoint included), each repeated for its pair.
    """

    def __init__(self, head_dim: int):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f'the rotary phase needs an even head dimension, got {head_dim}')
        theta = 1.0 / (10000 ** torch.linspace(0, 1, head_dim // 2))
        self.register_buffer('angle', theta.repeat_interleave(2))

    def forward(self, height: int, width: int, dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
        """-> sin, cos of shape (H, W, d)."""
        # phases reach H*W (66,800 at stride 4 of 1333x800): beyond float16, so always at least float32
        work = torch.promote_types(self.angle.dtype, torch.float32)
        index = torch.arange(height * width, device=self.angle.device, dtype=work)
        phase = (index[:, None] * self.angle.to(work)[None]).view(height, width, -1)
        return phase.sin().to(dtype), phase.cos().to(dtype)


def rotate_pairs(x: Tensor, sin: Tensor, cos: Tensor) -> Tensor:
    """Rotate each channel pair (x0, x1) of ``x`` (..., d) by the phase: x * cos + (-x1, x0) * sin."""
    turned = torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)
    return x * cos + turned * sin


class ManhattanSelfAttention(nn.Module):
    """MaSA with the rotary phase and LCE; full over the grid, or decomposed (width, then height).

    Args:
        dim: channels (value width = dim).
        num_heads: heads; ``dim // num_heads`` must be even (rotary pairs).
        decomposed: attend along rows then columns (``chunkwise_recurrent`` in the RMT code).
        fused: ``scaled_dot_product_attention`` or the explicit softmax reference.
    """

    def __init__(self, dim: int, num_heads: int, decomposed: bool = False, fused: bool = True):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim ** -0.5
        self.decomposed = decomposed
        self.fused = fused
        self.q_proj = nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, dim)
        self.v_proj = nn.Linear(dim, dim)
        self.lce = nn.Conv2d(dim, dim, 5, 1, 2, groups=dim)
        self.out_proj = nn.Linear(dim, dim)

    def forward(self, x: Tensor, sin: Tensor, cos: Tensor, bias: Union[Tensor, Tuple[Tensor, Tensor]]) -> Tensor:
        """x: (B, H, W, C); sin/cos: (H, W, d); bias: (heads, HW, HW) or ((heads, H, H), (heads, W, W))."""
        B, H, W, C = x.shape
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        lce = self.lce(v.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
        q = rotate_pairs(q.view(B, H, W, self.num_heads, -1).permute(0, 3, 1, 2, 4), sin, cos)
        k = rotate_pairs((k * self.scale).view(B, H, W, self.num_heads, -1).permute(0, 3, 1, 2, 4), sin, cos)
        v = v.view(B, H, W, self.num_heads, -1).permute(0, 3, 1, 2, 4)  # (B, heads, H, W, d)
        if self.decomposed:
            bias_h, bias_w = bias
            rows = attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), bias_w, 1., fused=self.fused)
            cols = attention(q.permute(0, 3, 1, 2, 4), k.permute(0, 3, 1, 2, 4), rows.permute(0, 3, 2, 1, 4), bias_h,
                             1., fused=self.fused)  # (B, W, heads, H, d)
            out = cols.permute(0, 3, 1, 2, 4)
        else:
            out = attention(q.flatten(2, 3), k.flatten(2, 3), v.flatten(2, 3), bias, 1., fused=self.fused)
            out = out.transpose(1, 2)
        out = out.reshape(B, H, W, C)
        return self.out_proj(out + lce)


class RMTStage(nn.Module):
    """``depth`` blocks sharing one decay (and rotary) context, then the optional downsampling.

    Returns the stage output (at the stage's resolution) and the downsampled map for the next stage.
    """

    def __init__(self, dim: int, out_dim: Optional[int], depth: int, num_heads: int, *, mlp_ratio: float,
                 init_value: float, heads_range: float, decomposed: bool, drop_path: Sequence[float],
                 layer_scale: Optional[float] = None, with_cp: bool = False, fused: bool = True,
                 norm_cfg: Optional[dict] = None):
        super().__init__()
        self.with_cp = with_cp
        self.decomposed = decomposed
        self.rotary = RasterRotary(dim // num_heads)
        self.decay = SpatialDecay(num_heads, init_value, heads_range)
        self.blocks = nn.ModuleList([
            RetentiveBlock(dim, ManhattanSelfAttention(dim, num_heads, decomposed, fused), mlp_ratio,
                           drop_path[i], layer_scale) for i in range(depth)
        ])
        self.downsample = ConvDownsample(dim, out_dim, norm_cfg) if out_dim else None

    def context(self, height: int, width: int, dtype: torch.dtype) -> tuple:
        sin, cos = self.rotary(height, width, dtype)
        if self.decomposed:
            bias = (self.decay.line(height, dtype), self.decay.line(width, dtype))
        else:
            bias = self.decay.grid(height, width, 'manhattan', dtype)
        return sin, cos, bias

    def forward(self, x: Tensor) -> Tuple[Tensor, Tensor]:
        context = self.context(x.shape[1], x.shape[2], x.dtype)
        x = checkpoint_seq(self.blocks, x, *context, enabled=self.with_cp)
        return x, (x if self.downsample is None else self.downsample(x))


@MODELS.register_module()
class RMT(DecayBackbone):
    """RMT as a multi-scale backbone (strides 4/8/16/32, NCHW, one LayerNorm per output).

    Args:
        arch: ``'t'``, ``'s'``, ``'b'``, ``'l'`` (also ``'rmt_t'`` ...; the official ``RMT_T3``, ``RMT_S``,
            ``RMT_M2``, ``RMT_L6``) or a dict with ``embed_dims``, ``depths``, ``num_heads`` and optionally
            ``mlp_ratios``, ``init_values`` (a), ``heads_ranges`` (b - a), ``decomposed`` (per stage),
            ``layer_scales`` (per stage) and ``drop_path_rate``.
        in_channels: image channels.
        drop_path_rate: stochastic depth at the last block; None takes the preset's official value
            (0.1 / 0.15 / 0.4 / 0.5 for T / S / B / L, also what the official detection configs use).
        layer_init_values: initial layer-scale value where the arch has layer scale.
        fused_attn: ``scaled_dot_product_attention`` (True) or the explicit softmax reference (False, the parity
            oracle); None takes the global default (:mod:`~mmvisatt.models.layers.attention`).
        out_norms: a LayerNorm per output (dense tasks, as the official ``extra_norms``); False returns the raw
            stage outputs, which the official classifier reads (with :class:`RMTProjectionNeck`).
        out_indices: outputs to return (default: all stages, i.e. (0, 1, 2, 3)).
        norm_cfg: the BatchNorm of the conv stem and the downsampling convs (default ``BN``; the official
            detection / segmentation code uses ``SyncBN``, in training mode, which the dense configs set).
        frozen_stages, norm_eval, with_cp, init_cfg: as every mmvisatt backbone. A ``Pretrained``
            init_cfg may name ``checkpoint_key`` (e.g. ``'model'``) to pick an entry of a release file;
            by default ``model_ema`` is used when present (the weights RMT-S/B/L report; RMT-T reports
            ``model``, which the ``'t'`` preset picks).
    """
    arch_zoo: Dict[str, dict] = {
        # RMT-T's reported accuracy is of the plain weights, S/B/L's of the EMA (qhfan/RMT issue 25)
        't': dict(embed_dims=(64, 128, 256, 512), depths=(2, 2, 8, 2), num_heads=(4, 4, 8, 16),
                  mlp_ratios=(3, 3, 3, 3), heads_ranges=(4, 4, 6, 6), decomposed=(True, True, False, False),
                  drop_path_rate=0.1, release_keys=('model', 'model_ema')),
        's': dict(embed_dims=(64, 128, 256, 512), depths=(3, 4, 18, 4), num_heads=(4, 4, 8, 16),
                  mlp_ratios=(4, 4, 3, 3), heads_ranges=(4, 4, 6, 6), drop_path_rate=0.15),
        'b': dict(embed_dims=(80, 160, 320, 512), depths=(4, 8, 25, 8), num_heads=(5, 5, 10, 16),
                  mlp_ratios=(4, 4, 3, 3), heads_ranges=(5, 5, 6, 6), layer_scales=(False, False, True, True),
                  drop_path_rate=0.4),
        'l': dict(embed_dims=(112, 224, 448, 640), depths=(4, 8, 25, 8), num_heads=(7, 7, 14, 20),
                  mlp_ratios=(4, 4, 3, 3), heads_ranges=(6, 6, 6, 6), layer_scales=(False, False, True, True),
                  drop_path_rate=0.5),
    }
    _per_stage_keys = DecayBackbone._per_stage_keys + ('decomposed', )
    _arch_prefix = 'rmt'

    def __init__(self, arch: Union[str, dict] = 't', *, in_channels: int = 3, drop_path_rate: Optional[float] = None,
                 layer_init_values: float = 1e-6, fused_attn: Optional[bool] = None, out_norms: bool = True,
                 out_indices: Optional[Sequence[int]] = None, frozen_stages: int = -1, norm_eval: bool = False,
                 with_cp: bool = False, norm_cfg: Optional[dict] = None, init_cfg: Optional[dict] = None):
        super().__init__(init_cfg=init_cfg)
        arch = self._resolve_arch(arch)
        self._release_keys = tuple(arch.get('release_keys', self._release_keys))
        self._build(arch, in_channels=in_channels, drop_path_rate=drop_path_rate,
                    layer_init_values=layer_init_values, fused_attn=fused_attn, out_norms=out_norms,
                    out_indices=out_indices, frozen_stages=frozen_stages, norm_eval=norm_eval, with_cp=with_cp,
                    norm_cfg=norm_cfg)

    def _make_stem(self, in_channels: int, dim: int, norm_cfg: Optional[dict]) -> nn.Module:
        return ConvStem(in_channels, dim, norm_cfg)

    def _make_stage(self, i: int, drop_path: List[float], *, arch: dict, layer_init_values: float, with_cp: bool,
                    norm_cfg: Optional[dict]) -> nn.Module:
        dims = arch['embed_dims']
        return RMTStage(dims[i], dims[i + 1] if i < len(dims) - 1 else None, arch['depths'][i], arch['num_heads'][i],
                        mlp_ratio=arch['mlp_ratios'][i], init_value=arch['init_values'][i],
                        heads_range=arch['heads_ranges'][i], decomposed=arch['decomposed'][i], drop_path=drop_path,
                        layer_scale=layer_init_values if arch['layer_scales'][i] else None, with_cp=with_cp,
                        fused=self.fused_attn, norm_cfg=norm_cfg)

    @classmethod
    def _stage_defaults(cls, num_stages: int) -> dict:
        return {**super()._stage_defaults(num_stages), 'decomposed': (True, True, True, False)[:num_stages]}


@MODELS.register_module()
class RMTProjectionNeck(nn.Module):
    """The official RMT classifier up to its logits: Linear(C -> projection) on every token, BatchNorm, Swish,
    mean over tokens. An mmpretrain ``ImageClassifier`` neck: reads the last (raw, ``out_norms=False``) backbone
    output and returns ``((B, projection), )`` for a ``LinearClsHead`` with ``in_channels=projection``.
    """

    def __init__(self, in_channels: int, projection: int = 1024):
        super().__init__()
        self.proj = nn.Linear(in_channels, projection)
        self.norm = nn.BatchNorm2d(projection)

    def forward(self, inputs: Tuple[Tensor, ...]) -> Tuple[Tensor]:
        x = self.norm(self.proj(inputs[-1].permute(0, 2, 3, 1)).permute(0, 3, 1, 2))
        return ((x * torch.sigmoid(x)).mean(dim=(2, 3)), )


# ---------------------------------------------------------------------------------------------------------
# Checkpoints: official classification (plain / token-labelling, raw or in 'model' / 'model_ema'), official
# detection/segmentation ('backbone.' + extra_norms), and mmvisatt (mm-style) files.
# ---------------------------------------------------------------------------------------------------------
_OFFICIAL_KEY = 'layers.0.blocks.0.retention.q_proj.weight'
_MM_KEY = 'stages.0.rotary.angle'
_BLOCK_RENAMES = (('retention_layer_norm.', 'norm1.'), ('final_layer_norm.', 'norm2.'),
                  ('retention.lepe.conv.', 'attn.lce.'), ('retention.', 'attn.'), ('ffn.dwconv.conv.', 'ffn.dwconv.'),
                  ('pos.conv.', 'cpe.'))
# the classifier as an mmpretrain ImageClassifier: RMTProjectionNeck + LinearClsHead
_HEAD_RENAMES = {'proj': 'neck.proj', 'norm': 'neck.norm', 'head': 'head.fc'}


def _rename_official(key: str) -> Optional[str]:
    """An official RMT backbone key -> the mmvisatt backbone key (without prefix); None for the classifier."""
    m = re.match(r'layers\.(\d+)\.(.*)', key)
    if m:
        stage, rest = m.groups()
        rest = rest.replace('Relpos.angle', 'rotary.angle').replace('Relpos.decay', 'decay.log_gamma')
        for old, new in _BLOCK_RENAMES:
            rest = re.sub(r'^(blocks\.\d+\.)' + re.escape(old), r'\g<1>' + new, rest)
        return f'stages.{stage}.{rest}'
    m = re.match(r'extra_norms\.(\d+)\.(.*)', key)
    if m:
        return f'norm{m.group(1)}.{m.group(2)}'
    if key.startswith('patch_embed.'):
        return key
    return None


def _convert_official(state_dict) -> Dict[str, Tensor]:
    out, dropped = {}, []
    for key, value in state_dict.items():
        new = _rename_official(key)
        if new is not None:
            if re.search(r'\.gamma_[12]$', new):
                value = value.reshape(-1)  # official (1, 1, 1, C)
            out['backbone.' + new] = value
            continue
        head, _, rest = key.partition('.')
        if head in _HEAD_RENAMES:
            out[f'{_HEAD_RENAMES[head]}.{rest}'] = value
        else:
            dropped.append(key)
    if dropped:
        # the token-labelling release adds aux_head (per-token logits for MixToken training); nothing uses it
        print_log(f'RMT checkpoint: dropped {len(dropped)} entries without an mmvisatt counterpart '
                  f'({", ".join(sorted({k.rsplit(".", 1)[0] for k in dropped}))})', logger='current')
    return out


@register_converter('rmt', is_mm=lambda keys: _MM_KEY in keys, keep=('neck.', 'head.'))
def convert_rmt_checkpoint(state_dict: Dict[str, Tensor], prefixed: bool) -> Optional[Tuple[Dict[str, Tensor], str]]:
    """Official RMT (classification, token-labelling, detection/segmentation) keys -> mm-style RMT keys
    (``backbone.*``; the classifier as ``neck.proj.*``, ``neck.norm.*`` (:class:`RMTProjectionNeck`) and
    ``head.fc.*``)."""
    keys = set(state_dict)
    if _OFFICIAL_KEY not in keys:
        return None
    if prefixed:
        return _convert_official(state_dict), 'official-rmt-dense'
    return _convert_official(state_dict), 'official-rmt-token-label' if 'aux_head.weight' in keys else 'official-rmt'
