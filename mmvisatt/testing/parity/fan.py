"""Parity builders for FAN (NVlabs/FAN): ``models/fan.py`` ``FAN`` (ViT and hybrid classifiers),
``detection/models/fan.py`` ``FAN`` (the hybrid detection backbone) and ``models/swin_utils.py``
``SwinTransformer`` (FAN-Swin classifiers)."""
from typing import Dict, List, Optional

import torch.nn as nn
from timm.models.convnext import ConvNeXtStage
from torch import Tensor

from mmvisatt.models.backbones.fan import FANBase, FANBlock, official_swin_to_mmvisatt_key, official_to_mmvisatt_key
from mmvisatt.models.backbones.fan_hybrid import FANHybrid
from mmvisatt.models.backbones.fan_swin import FANSwin, FANSwinBlock
from mmvisatt.models.backbones.fan_vit import FANViT

from . import StageTap, load_converted, register_parity_builder


class FANTap(StageTap):
    """Runs a FAN backbone and returns the maps at the official stage points plus the classifier's logits.

    Classifiers run :meth:`forward_classifier` and read their stage points by forward hooks (token outputs
    are laid back on their grid, row-major); a dense backbone (``head=None``) returns its own outputs.
    """

    def __init__(self, backbone: FANBase, taps: List[str], head: Optional[nn.Module]):
        super().__init__(backbone, taps, lambda x: x, head)

    def _read(self, module: nn.Module, args: tuple, output: Tensor) -> Tensor:
        if isinstance(module, FANBlock):
            H, W = args[1]
            return output.transpose(1, 2).reshape(output.shape[0], -1, H, W)
        if isinstance(module, FANSwinBlock):
            return output.permute(0, 3, 1, 2)
        if isinstance(module, ConvNeXtStage):
            return output
        raise TypeError(f'No stage-point reading for {type(module).__name__}')

    def forward(self, images: Tensor) -> Dict[str, object]:
        self._captured.clear()
        if self.head is None:
            return {'stages': list(self.backbone(images))}
        logits = self.head(self.backbone.forward_classifier(images))
        return {'stages': [self._captured[name] for name in self.taps], 'logits': logits}


def _uniform(value, what: str):
    if isinstance(value, (list, tuple)):
        if len(set(value)) != 1:
            raise ValueError(f'mmvisatt FAN uses one {what} for all blocks, got {list(value)}')
        return value[0]
    return value


def _point_to_module(point: str, swin: bool) -> str:
    # stage points are module names; the converter's key renaming maps them like parameter names
    key = official_swin_to_mmvisatt_key(point + '.weight') if swin else official_to_mmvisatt_key(point + '.weight')
    return key[:-len('.weight')]


@register_parity_builder('fan', 'FAN')
def _fan_from_official(meta: dict, state_dict: dict, fused_attn: bool = False) -> nn.Module:
    kw = meta['official_kwargs']
    dense = meta['official_file'].startswith(('detection/', 'segmentation/'))
    unsupported = {
        'se_mlp': kw.get('se_mlp'), 'c_head_num': kw.get('c_head_num'),
        'use_pos_embed=False': not kw.get('use_pos_embed', True), 'eta=None': kw.get('eta', 1.) is None,
        'act_layer/norm_layer': kw.get('act_layer') or kw.get('norm_layer'),
        'channel_dims': len(set(kw.get('channel_dims') or [kw['embed_dim']])) > 1,
    }
    if any(unsupported.values()):
        raise ValueError(f'Official FAN options without an mmvisatt equivalent: '
                         f'{[k for k, v in unsupported.items() if v]}')
    arch = dict(embed_dims=kw['embed_dim'], depth=kw['depth'], num_heads=_uniform(kw['num_heads'], 'head count'))
    stem = kw.get('backbone')
    if stem:
        stem_kw = stem['kwargs']
        if kw.get('hybrid_patch_size', 2) != 2 or stem_kw.get('patch_size', 4) != 4:
            raise ValueError('mmvisatt FAN-Hybrid has the official 4x4 ConvNeXt stem and 2x2 projection')
        depths = list(stem_kw['depths'])
        arch.update(form='hybrid', stem_depths=depths, stem_dims=list(stem_kw['dims'][:len(depths)]))
    else:
        if kw.get('patch_size', 16) != 16:
            raise ValueError('mmvisatt FAN-ViT has the official stride-16 conv stem only')
        arch.update(form='vit')
    if dense:
        if arch['form'] != 'hybrid' or meta['official_file'].startswith('segmentation/'):
            raise ValueError('mmvisatt reproduces the official detection layout of FAN-Hybrid only')
        arch.update(out_block=kw.get('out_index', -1), down_channels=768)  # 768 is hard-coded officially
    form_class = FANHybrid if arch['form'] == 'hybrid' else FANViT
    backbone = form_class(arch=arch, in_channels=kw.get('in_chans', 3), mlp_ratio=kw.get('mlp_ratio', 4.),
                          qkv_bias=kw.get('qkv_bias', True), drop_rate=kw.get('drop_rate', 0.),
                          attn_drop_rate=kw.get('attn_drop_rate', 0.), drop_path_rate=kw.get('drop_path_rate', 0.),
                          eta=kw.get('eta', 1.), cls_attn_layers=kw.get('cls_attn_layers', 2),
                          cls_tokens_norm=kw.get('tokens_norm', False), classifier=not dense,
                          out_indices=(0, 1, 2, 3) if dense else (2, ), out_norms=False,
                          pos_exponent='linear' if dense else 'paired', fused_attn=fused_attn)
    head = nn.Linear(kw['embed_dim'], kw['num_classes']) if 'logits_shape' in meta else None
    load_converted(backbone, head, state_dict, 'fan', allow_missing=backbone.not_in_pretrained)
    taps = [] if dense else [_point_to_module(p, swin=False) for p in meta['stage_points']]
    return FANTap(backbone, taps, head).eval()


@register_parity_builder('fan', 'SwinTransformer')
def _fan_swin_from_official(meta: dict, state_dict: dict, fused_attn: bool = False) -> nn.Module:
    kw = meta['official_kwargs']
    mlp_type = kw.get('mlp_type')
    if kw.get('ape') or not kw.get('patch_norm', True) or not isinstance(mlp_type, (list, tuple)):
        raise ValueError('mmvisatt FAN-Swin has no absolute position encoding, has patch norm, and takes one '
                         'mlp_type per stage')
    arch = dict(form='swin', embed_dims=kw['embed_dim'], depths=list(kw['depths']), num_heads=list(kw['num_heads']),
                channel_attn=[t != 'Mlp' for t in mlp_type])
    backbone = FANSwin(arch=arch, in_channels=kw.get('in_chans', 3), patch_size=kw.get('patch_size', 4),
                       window_size=kw.get('window_size', 7), mlp_ratio=kw.get('mlp_ratio', 4.),
                       qkv_bias=kw.get('qkv_bias', True), drop_rate=kw.get('drop_rate', 0.),
                       attn_drop_rate=kw.get('attn_drop_rate', 0.), drop_path_rate=kw.get('drop_path_rate', 0.1),
                       out_indices=(0, 1, 2, 3), fused_attn=fused_attn)
    head = nn.Linear(backbone.num_features[-1], kw['num_classes']) if 'logits_shape' in meta else None
    load_converted(backbone, head, state_dict, 'fan', allow_missing=backbone.not_in_pretrained)
    taps = [_point_to_module(p, swin=True) for p in meta['stage_points']]
    return FANTap(backbone, taps, head).eval()
