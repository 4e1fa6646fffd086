"""Parity builders for RMT: the official classifier ``VisRetNet`` and the official dense backbone ``RMT``
(qhfan/RMT ``classfication_release/RMT.py`` and ``detect/mmdet/models/backbones/RMT.py``)."""
import re
from typing import Dict, List

import torch.nn as nn
from torch import Tensor

from mmvisatt.checkpoint import convert_state_dict, load_into, unwrap_state_dict
from mmvisatt.models.backbones.rmt import RMT, RMTProjectionNeck

from . import StageTap, register_parity_builder

# constructor defaults of the official VisRetNet / RMT (the factories RMT_T3 ... override most of them)
OFFICIAL_DEFAULTS = dict(in_chans=3, num_classes=1000, embed_dims=[96, 192, 384, 768], depths=[2, 2, 6, 2],
                         num_heads=[3, 6, 12, 24], init_values=[1, 1, 1, 1], heads_ranges=[3, 3, 3, 3],
                         mlp_ratios=[3, 3, 3, 3], chunkwise_recurrents=[True, True, False, False], projection=1024,
                         layerscales=[False, False, False, False], layer_init_values=1e-6, drop_path_rate=0.1)


class RMTClassifier(nn.Module):
    """The official head as mmpretrain would run it: :class:`RMTProjectionNeck`, then a linear layer."""

    def __init__(self, dim: int, num_classes: int, projection: int = 1024):
        super().__init__()
        self.neck = RMTProjectionNeck(dim, projection)
        self.fc = nn.Linear(projection, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        """x: (B, C, H, W) raw last-stage map -> (B, num_classes)."""
        return self.fc(self.neck((x, ))[0])


class RMTTap(StageTap):
    """StageTap whose classifier reads the raw (un-normalised) last-stage tokens, as the official head does."""

    def __init__(self, backbone: nn.Module, taps: List[str], head: nn.Module, last_block: str):
        super().__init__(backbone, [*taps, last_block], lambda t: t.permute(0, 3, 1, 2))
        self.cls_head = head
        self.num_stage_points = len(taps)

    def forward(self, images: Tensor) -> Dict[str, object]:
        result = super().forward(images)
        stages = result['stages']
        result['stages'] = stages[:self.num_stage_points]
        if self.cls_head is not None:
            result['logits'] = self.cls_head(stages[-1])
        return result


def _tap_name(point: str) -> str:
    """An official module name (``layers.i.blocks.j`` or, for the dense backbone, ``extra_norms.i``)."""
    m = re.fullmatch(r'layers\.(\d+)\.blocks\.(\d+)', point)
    if m:
        return f'stages.{m.group(1)}.blocks.{m.group(2)}'
    m = re.fullmatch(r'extra_norms\.(\d+)', point)
    if m:
        return f'norm{m.group(1)}'
    raise ValueError(f"Stage point '{point}' is not an official RMT block (layers.<i>.blocks.<j>) or output norm "
                     f"(extra_norms.<i>)")


def _build(meta: dict, state_dict: dict, fused_attn: bool = False) -> nn.Module:
    kw = {**OFFICIAL_DEFAULTS, **meta['official_kwargs']}
    depths = list(kw['depths'])
    arch = dict(embed_dims=list(kw['embed_dims']), depths=depths, num_heads=list(kw['num_heads']),
                mlp_ratios=list(kw['mlp_ratios']), init_values=list(kw['init_values']),
                heads_ranges=list(kw['heads_ranges']), decomposed=list(kw['chunkwise_recurrents']),
                layer_scales=list(kw['layerscales']))
    n = len(depths)
    backbone = RMT(arch=arch, in_channels=kw['in_chans'], drop_path_rate=kw['drop_path_rate'],
                   layer_init_values=kw['layer_init_values'], fused_attn=fused_attn,
                   out_indices=tuple(kw.get('out_indices', range(n))))
    converted, _, layout = convert_state_dict(unwrap_state_dict(state_dict), 'rmt')
    dense = meta['official_class'] == 'RMT'
    load_into(backbone, {k[len('backbone.'):]: v for k, v in converted.items() if k.startswith('backbone.')},
              source='parity state dict', layout=layout, allow_missing=() if dense else RMT.not_in_pretrained)
    head = None
    if 'logits_shape' in meta:
        head = RMTClassifier(kw['embed_dims'][-1], meta.get('num_classes', kw['num_classes']), kw['projection'])
        weights = {k: v for k, v in converted.items() if k.startswith('neck.')}
        weights.update({k[len('head.'):]: v for k, v in converted.items() if k.startswith('head.fc.')})
        load_into(head, weights, source='parity state dict', layout=layout)
    taps = [_tap_name(p) for p in meta['stage_points']]
    return RMTTap(backbone, taps, head, f'stages.{n - 1}.blocks.{depths[-1] - 1}').eval()


register_parity_builder('rmt', 'VisRetNet')(_build)
register_parity_builder('rmt', 'RMT')(_build)
