"""Parity builders for the ReViT family: official ``SwinTransformer`` (ReSwin) and ``ReViT`` (ReViT, ReMViTv2), and
the official ReMViTv2 code's alignment of the carried scores, which only these fixtures use."""
import math
import re
from typing import List, Sequence, Tuple

import torch.nn as nn
import torch.nn.functional as F
from mmengine.registry import MODELS
from torch import Tensor

from mmvisatt.models.backbones import ReMViTv2, ReSwinTransformer, ReViT
from mmvisatt.models.layers.pooling_attention import PoolingResidualAttention
from mmvisatt.models.layers.residual_attention import (PooledScores, TokenGrid, mean_heads_if_changed, on_key_axis,
                                                       on_query_axis)

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
        out_indices=tuple(range(len(depths))), fused_attn=fused_attn)
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


_OFFICIAL_LIMITS = ('the official ReMViTv2 alignment handles only square token maps whose sides divide by the '
                    'pooling strides (e.g. 224x224 inputs); ReMViTv2 itself aligns by position and takes any size')


def _square_side(n: int) -> int:
    side = math.isqrt(n)
    if side * side != n:
        raise ValueError(f'{_OFFICIAL_LIMITS} (got a map of {n} tokens).')
    return side


def _fit(x: Tensor, side: int) -> Tensor:
    if tuple(x.shape[-2:]) != (side, side):
        raise ValueError(f'{_OFFICIAL_LIMITS} (resampling gives {tuple(x.shape[-2:])}, not {(side, side)}).')
    return x


def align_pooled_official(prev: PooledScores, q_grid: TokenGrid, kv_grid: TokenGrid, num_heads: int) -> Tensor:
    """The official ReMViTv2 alignment (ADiko1997/ReViT ``model/attention.py``), which sees token counts only.

    After averaging heads on a head-count change, each axis whose count changed is viewed as a sqrt(N) x sqrt(N)
    grid; a smaller query or key axis is average-pooled with kernel = stride = floor(sqrt(N_prev) / sqrt(N)), a
    larger key axis repeated (nearest) by floor(sqrt(N) / sqrt(N_prev)). Raises ``ValueError`` where the official
    code fails: non-square maps, pooled sizes that miss the target, a larger query axis.
    """
    scores = mean_heads_if_changed(prev.scores, num_heads)
    nq_prev, nk_prev = scores.shape[-2:]
    nq, nk = q_grid.num_tokens, kv_grid.num_tokens
    if (nq_prev, nk_prev) == (nq, nk):
        return scores
    if nq_prev < nq:
        raise ValueError(f'{_OFFICIAL_LIMITS} (the query axis grows from {nq_prev} to {nq} tokens).')
    if nq_prev > nq:
        side, new = _square_side(nq_prev), _square_side(nq)
        k = side // new
        scores = on_query_axis(scores, (side, side), lambda x: _fit(F.avg_pool2d(x, k, k), new))
    if nk_prev != nk:
        side, new = _square_side(nk_prev), _square_side(nk)
        if nk_prev > nk:
            k = side // new
            op = lambda x: _fit(F.avg_pool2d(x, k, k), new)  # noqa: E731
        else:
            factor = float(new // side)
            op = lambda x: _fit(F.interpolate(x, scale_factor=factor, mode='nearest'), new)  # noqa: E731
        scores = on_key_axis(scores, (side, side), op)
    return scores


def use_official_alignment(model: nn.Module) -> nn.Module:
    """Every pooling attention of ``model`` aligns the carried scores as the official ReMViTv2 code does, in place
    (the parity fixtures' alignment; ReMViTv2 aligns by image position, which gives the same numbers where the
    official code runs)."""
    for module in model.modules():
        if isinstance(module, PoolingResidualAttention):
            module.align = align_pooled_official
    return model


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
                  qkv_bias=r['qkv_bias'], learnable_alpha=bool(r.get('alpha')), fused_attn=fused_attn)
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
            residual_pooling=bool(r.get('residual_pooling')), out_indices=(len(starts) - 1, ), **common)
        block_names = {i: f'stages.{s}.blocks.{i - start}'
                       for s, (start, end) in enumerate(zip(starts, ends)) for i in range(start, end)}
        family, cls = 'remvit', ReMViTv2
    backbone = use_official_alignment(MODELS.build(backbone_cfg))
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
