"""Parity builder for the Shunted family: official ``SSA.ShuntedTransformer`` (OliverRensu/Shunted-Transformer)."""
import re
from typing import Dict, Optional

import torch.nn as nn
from torch import Tensor

from mmvisatt.models.backbones.shunted import HeadGroupKV, ShuntedAttention, ShuntedStem, ShuntedTransformer

from . import load_converted, register_parity_builder

# ShuntedTransformer.__init__ defaults of the official SSA.py, for kwargs a fixture leaves out
_OFFICIAL_DEFAULTS = dict(embed_dims=[64, 128, 256, 512], num_heads=[1, 2, 4, 8], mlp_ratios=[4, 4, 4, 4],
                          qkv_bias=False, qk_scale=None, drop_rate=0., attn_drop_rate=0., drop_path_rate=0.,
                          norm_layer='nn.LayerNorm', depths=[3, 4, 6, 3], sr_ratios=[8, 4, 2, 1], num_stages=4,
                          num_conv=0, num_classes=1000)


def _layer_norm_eps(norm_layer: str) -> float:
    """eps of the official ``norm_layer`` argument, given as source text (``partial(nn.LayerNorm, eps=1e-6)``)."""
    if not re.search(r'\bLayerNorm\b', norm_layer):
        raise ValueError(f'Official norm_layer {norm_layer!r} has no mmvisatt equivalent (LayerNorm only)')
    m = re.search(r'eps\s*=\s*([0-9.eE+-]+)', norm_layer)
    return float(m.group(1)) if m else 1e-5


class _FlooringStem(ShuntedStem):
    """The official stem: its 2x2 stride-2 conv drops an odd last row / column."""

    def _fit(self, x: Tensor) -> Tensor:
        return x


class _FlooringHeadGroupKV(HeadGroupKV):
    """The official key/value aggregation: its rate-r conv drops the rows / columns that do not fill a window."""

    def _fit(self, x: Tensor) -> Tensor:
        return x


def official_numerics(backbone: ShuntedTransformer, qk_scale: Optional[float] = None,
                      norm_eps: float = 1e-6) -> ShuntedTransformer:
    """Give ``backbone`` the official code's numerics where they differ from mmvisatt's, in place: sizes that the
    stem or an aggregation rate does not divide are floored (mmvisatt pads them), ``qk_scale`` replaces
    head_dim ** -0.5, and ``norm_eps`` is the eps of the block and stage LayerNorms. Every official release
    uses the defaults, and at sizes the rates divide (multiples of 32 with the official rates) the floor is the
    pad, so the released models need none of this; the fixtures' other configurations do."""
    for module in backbone.modules():
        if type(module) is ShuntedStem:
            module.__class__ = _FlooringStem
        elif type(module) is HeadGroupKV:
            module.__class__ = _FlooringHeadGroupKV
        elif isinstance(module, ShuntedAttention) and qk_scale:
            module.scale = qk_scale
    for stage in backbone.stages:
        for norm in [stage.norm] + [n for block in stage.blocks for n in (block.norm1, block.norm2)]:
            norm.eps = norm_eps
    return backbone


class ShuntedParity(nn.Module):
    """The backbone's stage outputs at the official stage points, and the official head on the mean token."""

    def __init__(self, backbone: ShuntedTransformer, stage_indices, head: Optional[nn.Module]):
        super().__init__()
        self.backbone = backbone
        self.stage_indices = list(stage_indices)
        self.head = head

    def forward(self, images: Tensor) -> Dict[str, object]:
        feats = self.backbone(images)
        result = {'stages': [feats[i] for i in self.stage_indices]}
        if self.head is not None:
            result['logits'] = self.head(feats[-1].mean(dim=(2, 3)))
        return result


@register_parity_builder('shunted', 'ShuntedTransformer')
def _shunted_from_official(meta: dict, state_dict: dict, fused_attn: bool = False) -> nn.Module:
    kw = {**_OFFICIAL_DEFAULTS, **meta['official_kwargs']}
    n = kw['num_stages']
    arch = {k: list(kw[k])[:n] for k in ('embed_dims', 'depths', 'num_heads', 'mlp_ratios', 'sr_ratios')}
    # the official stem always reads 3 channels whatever in_chans says
    backbone = official_numerics(ShuntedTransformer(
        arch=dict(arch, num_conv=kw['num_conv']), in_channels=3, qkv_bias=kw['qkv_bias'], fused_attn=fused_attn,
        drop_rate=kw['drop_rate'], attn_drop_rate=kw['attn_drop_rate'], drop_path_rate=kw['drop_path_rate'],
        out_indices=tuple(range(n))), kw['qk_scale'], _layer_norm_eps(kw['norm_layer']))
    num_classes = meta.get('num_classes', kw['num_classes'])
    head = nn.Linear(kw['embed_dims'][3], num_classes) if num_classes and 'logits_shape' in meta else None
    load_converted(backbone, head, state_dict, 'shunted', allow_missing=ShuntedTransformer.not_in_pretrained)
    indices = []
    for point in meta['stage_points']:
        m = re.fullmatch(r'norm(\d+)', point)
        if not m or not 1 <= int(m.group(1)) <= n:
            raise ValueError(f"Stage point '{point}' is not an official stage norm (norm1..norm{n})")
        indices.append(int(m.group(1)) - 1)
    return ShuntedParity(backbone, indices, head).eval()
