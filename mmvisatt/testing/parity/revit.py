"""Parity builders for the ReViT family: official ``SwinTransformer`` (ReSwin) and ``ReViT`` (ReViT, ReMViTv2)."""
import math
import re
from typing import List, Sequence, Tuple

import torch.nn as nn
from mmengine.registry import MODELS

from mmvisatt.models.backbones import ReMViTv2, ReSwinTransformer, ReViT

from . import StageTap, load_converted, register_parity_builder


@register_parity_builder('revit', 'SwinTransformer')
def _reswin_from_official_swin(meta: dict, state_dict: dict, fused_attn: bool = False) -> nn.Module:
    kw = meta['official_kwargs']
    if kw.get('ape') or not kw.get('patch_norm', True) or kw.get('head_dim') not in (None, ):
        raise ValueError('ReSwinTransformer supports the official Swin without absolute position embedding, '
                         'with patch norm and head_dim = dim // heads')
    depths = list(kw['depths'])
    backbone_cfg = dict(
        type='ReSwinTransformer',
        arch=dict(embed_dims=kw['embed_dim'], depths=depths, num_heads=list(kw['num_heads'])),
        in_channels=kw.get('in_chans', 3), patch_size=kw.get('patch_size', 4), window_size=kw['window_size'],
        mlp_ratio=kw.get('mlp_ratio', 4.), qkv_bias=kw.get('qkv_bias', True), residual_mode='official',
        out_indices=tuple(range(len(depths))))
    backbone = MODELS.build(backbone_cfg)
    head = nn.Linear(backbone.num_features[-1], kw['num_classes']) if kw.get('num_classes') else None
    load_converted(backbone, head, state_dict, 'reswin', allow_missing=ReSwinTransformer.not_in_pretrained)
    # the official stage points are the last block of each stage (before the next stage's patch merging)
    taps = [f'stages.{i}.blocks.{d - 1}' for i, d in enumerate(depths)]
    return StageTap(backbone, taps, lambda t: t.permute(0, 3, 1, 2), head, backbone_cfg=backbone_cfg).eval()


def _official_round_width(width: float, multiplier: float, divisor: int = 1) -> int:
    """MViT's rounding of widths and head counts (the official ``round_width`` with ``min_width=1``)."""
    if not multiplier:
        return int(width)
    width *= multiplier
    out = max(1, int(width + divisor / 2) // divisor * divisor)
    if out < 0.9 * width:
        out += divisor
    return int(out)


def _official_blocks(r: dict) -> Tuple[List[int], List[int], List[Sequence[int]]]:
    """Per-block output widths, head counts and query strides ([] = no query pooling) of an official ReViT cfg."""
    depth = r['depth']
    dim_mul, head_mul = [1.0] * (depth + 1), [1.0] * (depth + 1)
    for i, m in r.get('dim_mul') or []:
        dim_mul[i] = m
    for i, m in r.get('head_mul') or []:
        head_mul[i] = m
    strides: List[Sequence[int]] = [[] for _ in range(depth)]
    for entry in r.get('pool_q_stride') or []:
        strides[entry[0]] = list(entry[1:])
    dim, heads = r['embed_dim'], r['num_heads']
    dims, all_heads = [], []
    for i in range(depth):
        heads = _official_round_width(heads, head_mul[i])
        if r.get('dim_mul_in_att'):
            dim = _official_round_width(dim, dim_mul[i], divisor=_official_round_width(heads, head_mul[i]))
        else:
            dim = _official_round_width(dim, dim_mul[i + 1], divisor=_official_round_width(heads, head_mul[i + 1]))
        dims.append(dim)
        all_heads.append(heads)
    return dims, all_heads, strides


def _square(values: Sequence[int], what: str) -> int:
    if len(set(values)) != 1:
        raise ValueError(f'mmvisatt supports square {what} only, got {list(values)}')
    return values[0]


@register_parity_builder('revit', 'ReViT')
def _revit_from_official(meta: dict, state_dict: dict, fused_attn: bool = False) -> nn.Module:
    """ADiko1997/ReViT ``model/revit_model.py`` ``ReViT`` (one class for ReViT and ReMViTv2) from its cfg."""
    cfg = meta['official_kwargs']['cfg']
    r = cfg['ReViT']
    unsupported = {'mode': r.get('mode', 'conv') != 'conv', 'pool_first': r.get('pool_first'),
                   'cls_embed_on': r.get('cls_embed_on')}
    if any(unsupported.values()):
        raise ValueError(f'Official ReViT options without an mmvisatt equivalent: '
                         f'{[k for k, v in unsupported.items() if v]}')
    dims, heads, strides = _official_blocks(r)
    pooled = any(strides) or r.get('use_rel_pos') or len(set(dims)) > 1
    common = dict(in_channels=3, img_size=cfg['DATA']['crop_size'], mlp_ratio=r['mlp_ratio'],
                  qkv_bias=r['qkv_bias'], learnable_alpha=bool(r.get('alpha')))
    kernel = _square(r['patch_kernel'], 'patch kernels')
    stride = _square(r['patch_stride'], 'patch strides')
    padding = _square(r['patch_padding'], 'patch padding')
    if not pooled:
        if not r.get('use_abs_pos') or kernel != stride or padding:
            raise ValueError('A plain official ReViT maps to mmvisatt ReViT with an absolute position embedding '
                             'and non-overlapping patches')
        backbone_cfg = dict(type='ReViT', arch=dict(embed_dims=r['embed_dim'], depth=r['depth'],
                                                    num_heads=r['num_heads']),
                            patch_size=stride, out_indices=(2, ), **common)
        block_names = {i: f'blocks.{i}' for i in range(r['depth'])}
        family, cls = 'revit', ReViT
    else:
        if r.get('use_abs_pos') or not strides[0] and any(strides) or not all(strides):
            raise ValueError('mmvisatt ReMViTv2 pools the queries of every block and has no absolute position '
                             'embedding, like MViTv2; this official cfg differs')
        starts = [0] + [i for i in range(1, len(strides)) if math.prod(strides[i]) > 1]
        if math.prod(strides[0]) > 1 or len({tuple(strides[i]) for i in starts[1:]}) > 1:
            raise ValueError(f'mmvisatt ReMViTv2 strides the first block of every later stage by one stride, '
                             f'got query strides {strides}')
        ends = starts[1:] + [len(dims)]
        for start, end in zip(starts, ends):
            if len(set(dims[start:end])) > 1 or len(set(heads[start:end])) > 1:
                raise ValueError(f'Widths and heads change inside a stage (blocks {start}..{end - 1}): '
                                 f'{dims}, {heads}')
        if not r.get('dim_mul_in_att') and len(set(dims)) > 1:
            raise ValueError('mmvisatt ReMViTv2 widens the channels in attention (dim_mul_in_att=True)')
        adaptive = r.get('pool_kv_stride_adaptive')
        if not adaptive:
            raise ValueError('mmvisatt ReMViTv2 derives key/value strides adaptively (pool_kv_stride_adaptive)')
        backbone_cfg = dict(
            type='ReMViTv2',
            arch=dict(embed_dims=[dims[i] for i in starts], num_heads=[heads[i] for i in starts],
                      depths=[end - start for start, end in zip(starts, ends)]),
            patch_cfg=dict(kernel_size=kernel, stride=stride, padding=padding),
            pool_kernel=tuple(r['pool_qkv_kernel']), q_stride=tuple(strides[starts[1]]) if len(starts) > 1 else 1,
            adaptive_kv_stride=tuple(adaptive), rel_pos=bool(r.get('use_rel_pos')),
            residual_pooling=bool(r.get('residual_pooling')), residual_mode='official',
            out_indices=(len(starts) - 1, ), **common)
        block_names = {i: f'stages.{s}.blocks.{i - start}'
                       for s, (start, end) in enumerate(zip(starts, ends)) for i in range(start, end)}
        family, cls = 'remvit', ReMViTv2
    backbone = MODELS.build(backbone_cfg)
    num_classes = cfg['MODEL'].get('num_classes')
    head = nn.Linear(dims[-1], num_classes) if num_classes and 'logits_shape' in meta else None
    load_converted(backbone, head, state_dict, family, allow_missing=cls.not_in_pretrained)
    taps = []
    for point in meta['stage_points']:
        m = re.fullmatch(r'blocks\.(\d+)', point)
        if not m:
            raise ValueError(f"Stage point '{point}' is not an official block output (blocks.<i>)")
        taps.append(block_names[int(m.group(1))])
    # the head pools the normalised last map: norm2 of ReViT (its final norm, stride 16), norm3 of ReMViTv2
    return StageTap(backbone, taps, lambda t: t.permute(0, 3, 1, 2), head, backbone_cfg=backbone_cfg).eval()
