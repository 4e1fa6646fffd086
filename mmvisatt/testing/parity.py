"""Models equivalent to official implementations, for numerical parity checks (see shared parity contract).

``parity_model(meta, state_dict)`` builds the mmvisatt model described by a fixture's ``meta.json``, loads the
official-layout weights through the public conversion path and returns a module whose forward gives
``{'stages': [NCHW tensors at meta['stage_points']], 'logits': ...}``.
"""
import math
import re
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
from torch import Tensor

from mmvisatt.checkpoint import convert_state_dict, load_into, unwrap_state_dict
from mmvisatt.models.backbones.revit import ReMViTv2, ReSwinTransformer, ReViT


class StageTap(nn.Module):
    """Runs a backbone, records the raw outputs of chosen submodules by forward hooks, and adds a linear head.

    Hooks rather than a special forward keep the backbone exactly the module users train.
    """

    def __init__(self, backbone: nn.Module, taps: List[str], to_nchw: Callable[[Tensor], Tensor],
                 head: Optional[nn.Module] = None, pool_index: int = -1):
        super().__init__()
        self.backbone = backbone
        self.head = head
        self.taps = taps
        self.pool_index = pool_index
        self._to_nchw = to_nchw
        self._captured: Dict[str, Tensor] = {}
        modules = dict(backbone.named_modules())
        for name in taps:
            modules[name].register_forward_hook(self._hook(name))

    def _hook(self, name: str):
        def capture(module, args, output):
            self._captured[name] = output[0] if isinstance(output, tuple) else output
        return capture

    def forward(self, images: Tensor) -> Dict[str, object]:
        self._captured.clear()
        feats = self.backbone(images)
        result = {'stages': [self._to_nchw(self._captured[name]) for name in self.taps]}
        if self.head is not None:
            result['logits'] = self.head(feats[self.pool_index].mean(dim=(2, 3)))
        return result


def _reswin_from_official_swin(meta: dict, state_dict: dict) -> nn.Module:
    kw = meta['official_kwargs']
    if kw.get('ape') or not kw.get('patch_norm', True) or kw.get('head_dim') not in (None, ):
        raise ValueError('ReSwinTransformer supports the official Swin without absolute position embedding, '
                         'with patch norm and head_dim = dim // heads')
    depths = list(kw['depths'])
    backbone = ReSwinTransformer(
        arch=dict(embed_dims=kw['embed_dim'], depths=depths, num_heads=list(kw['num_heads'])),
        in_channels=kw.get('in_chans', 3), patch_size=kw.get('patch_size', 4), window_size=kw['window_size'],
        mlp_ratio=kw.get('mlp_ratio', 4.), qkv_bias=kw.get('qkv_bias', True), residual_mode='official',
        out_indices=tuple(range(len(depths))))
    head = nn.Linear(backbone.num_features[-1], kw['num_classes']) if kw.get('num_classes') else None
    _load_converted(backbone, head, state_dict, 'reswin', allow_missing=ReSwinTransformer.new_keys)
    # the official stage points are the last block of each stage (before the next stage's patch merging)
    taps = [f'stages.{i}.blocks.{d - 1}' for i, d in enumerate(depths)]
    return StageTap(backbone, taps, lambda t: t.permute(0, 3, 1, 2), head).eval()


def _load_converted(backbone: nn.Module, head: Optional[nn.Module], state_dict: dict, family: str,
                    allow_missing=()) -> None:
    converted, _, layout = convert_state_dict(unwrap_state_dict(state_dict), family)
    load_into(backbone, {k[len('backbone.'):]: v for k, v in converted.items() if k.startswith('backbone.')},
              source='parity state dict', layout=layout, allow_missing=allow_missing)
    if head is not None:
        load_into(head, {k[len('head.fc.'):]: v for k, v in converted.items() if k.startswith('head.fc.')},
                  source='parity state dict', layout=layout)


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


def _revit_from_official(meta: dict, state_dict: dict) -> nn.Module:
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
        backbone = ReViT(arch=dict(embed_dims=r['embed_dim'], depth=r['depth'], num_heads=r['num_heads']),
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
        backbone = ReMViTv2(
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
    num_classes = cfg['MODEL'].get('num_classes')
    head = nn.Linear(dims[-1], num_classes) if num_classes and 'logits_shape' in meta else None
    _load_converted(backbone, head, state_dict, family, allow_missing=cls.new_keys)
    taps = []
    for point in meta['stage_points']:
        m = re.fullmatch(r'blocks\.(\d+)', point)
        if not m:
            raise ValueError(f"Stage point '{point}' is not an official block output (blocks.<i>)")
        taps.append(block_names[int(m.group(1))])
    # the head pools the normalised last map: norm2 of ReViT (its final norm, stride 16), norm3 of ReMViTv2
    return StageTap(backbone, taps, lambda t: t.permute(0, 3, 1, 2), head).eval()


_BUILDERS = {
    ('revit', 'SwinTransformer'): _reswin_from_official_swin,
    ('revit', 'ReViT'): _revit_from_official,
}


def parity_model(meta: dict, state_dict: dict) -> nn.Module:
    """Build, load and return (in eval mode) the mmvisatt equivalent of the official model in ``meta``."""
    key = (meta['family'], meta['official_class'])
    if key not in _BUILDERS:
        raise NotImplementedError(f"No mmvisatt equivalent of {meta['official_repo']} {meta['official_class']} "
                                  f"yet; supported: {sorted(_BUILDERS)}")
    model = _BUILDERS[key](meta, state_dict)
    return model.eval()
