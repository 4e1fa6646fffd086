"""ReViT: a plain ViT with attention residual connections (Diko et al., arXiv 2402.11301).

Every block attends with ``S_l = alpha * q k^T / sqrt(d) + (1 - alpha) * S_{l-1}``, one learnable ``alpha`` for
the whole network; all blocks score the same token pairs, so the residual is mixed elementwise, head by head. The
block and its attention are shared with ReMViTv2 (:mod:`mmvisatt.models.layers.pooling_attention`). Backbone, then
the checkpoint converter.
"""
import math
from typing import Dict, Optional, Sequence, Set, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.registry import MODELS
from timm.layers import trunc_normal_
from torch import Tensor

from mmvisatt.checkpoint import register_converter
from mmvisatt.checkpoint.renames import final_norm_key, head_key
from ..layers.attention import resolve_fused_attn
from ..layers.checkpoint import checkpoint
from ..layers.patch import PatchEmbed
from ..layers.pooling_attention import ResidualAttentionBlock
from ..layers.residual_attention import ScoreFactors, make_alpha
from ..layers.score_memory import check_score_memory
from ..layers.simple_pyramid import PYRAMID_SCALES, SimpleFeaturePyramid
from .base import AttentionBackbone, LayerOrder, drop_path_rates, init_transformer_weights


@MODELS.register_module()
class ReViT(AttentionBackbone):
    """ReViT: a plain ViT with residual attention scores, as a multi-scale backbone.

    ReViT-B is ViT-B/16 without a class token (classification pools the mean token) plus one learnable
    ``alpha``. All layers score the same token pairs, so the residual is mixed elementwise, head by head.
    For dense tasks the last block's stride-16 map feeds ViTDet's simple feature pyramid
    (:class:`~mmvisatt.models.layers.simple_pyramid.SimpleFeaturePyramid`): strides 4/8/16/32 with
    ``num_features = [C/4, C/2, C, C]`` channels (192/384/768/768 for ReViT-B: the FPN ``in_channels``), each
    through its own LayerNorm ``norm{i}``. ``norm2`` (stride 16) is the ViT's final norm and loads from it.

    Args:
        arch: 'b' (also 'revit_b', 'base') or a dict with ``embed_dims``, ``depth`` and ``num_heads``.
        img_size: input size the position embedding is laid out for (224: 14x14 tokens); other inputs
            interpolate it bicubically to their token grid.
        patch_size: patch size and stride; inputs are padded to a multiple of it and outputs cropped back to
            ceil(H / stride) rows.
        learnable_alpha: the residual gate (0.5 at first) learns; False keeps it the constant 0.5.
        out_indices: pyramid levels returned, 0..3 = strides 4/8/16/32 (for patch size 16).
        frozen_stages: -1 freezes nothing; 0 the patch and position embeddings; n > 0 also the first n blocks
            and alpha.
        norm_eval: keep normalisation layers in eval mode while training. with_cp: checkpoint each block.
        score_memory: how the blocks keep the residual scores (:mod:`~mmvisatt.models.layers.score_memory`):
            ``'full'`` (default), one N x N map per block, the reference; ``'factors'``, the maps as per-block
            queries and keys (:class:`~mmvisatt.models.layers.residual_attention.ScoreFactors`), O(N) each, which
            widen the score product by ``head_dim`` per block. The maps are block outputs, so ``with_cp`` cannot
            drop them; at detection sizes they are most of ReViT-B's training memory. Values equal the reference's
            up to rounding.
        fused_attn: ``scaled_dot_product_attention`` with the carried scores as its bias (True), or the explicit
            softmax (False, the reference the parity fixtures check); None takes timm's global setting.
        fold_every: with ``'factors'``, fold them into one stored score map every ``fold_every`` blocks (the
            folding block makes its map anyway), which bounds the product's width; None never stores a map
            (least memory, most compute).
    """
    arch_zoo = {'b': dict(embed_dims=768, depth=12, num_heads=12)}
    _arch_keys = ('embed_dims', 'depth', 'num_heads')
    _arch_prefix = 'revit'
    # Keys that official / timm (classification) checkpoints cannot have.
    not_in_pretrained = ('alpha', 'norm0.*', 'norm1.*', 'norm3.*', 'pyramid.*')

    _stem = ('patch_embed', 'pos_embed')
    _frozen_units = 'blocks'
    _stage_norms = False  # the output norms belong to the pyramid's levels

    def __init__(self, arch: Union[str, dict] = 'b', *, in_channels: int = 3, img_size: int = 224,
                 patch_size: int = 16, mlp_ratio: float = 4., qkv_bias: bool = True, drop_path_rate: float = 0.1,
                 learnable_alpha: bool = True, out_indices: Sequence[int] = (0, 1, 2, 3),
                 frozen_stages: int = -1, norm_eval: bool = False, with_cp: bool = False, score_memory: str = 'full',
                 fused_attn: Optional[bool] = None, fold_every: Optional[int] = 3, init_cfg: Optional[dict] = None):
        super().__init__(init_cfg=init_cfg)
        arch = self._resolve_arch(arch)
        dim, depth = arch['embed_dims'], arch['depth']
        self.fused_attn = resolve_fused_attn(fused_attn)
        self.score_memory = check_score_memory(score_memory, ('full', 'factors'), type(self).__name__)
        if fold_every is not None and fold_every < 1:
            raise ValueError(f'fold_every must be a positive number of blocks, or None never to fold, got '
                             f'{fold_every}')
        self.fold_every = fold_every
        self._set_interface(in_channels, out_indices, len(PYRAMID_SCALES), frozen_stages, norm_eval)
        self.patch_size = patch_size
        self.with_cp = with_cp

        self.patch_embed = PatchEmbed(in_channels, dim, patch_size, norm=False)
        self.pos_grid = (img_size // patch_size, img_size // patch_size)
        self.pos_embed = nn.Parameter(torch.zeros(1, self.pos_grid[0] * self.pos_grid[1], dim))
        self.alpha = make_alpha(learnable_alpha)
        rates = drop_path_rates(drop_path_rate, depth)
        self.blocks = nn.ModuleList([
            ResidualAttentionBlock(dim, dim, arch['num_heads'], mlp_ratio=mlp_ratio, qkv_bias=qkv_bias,
                                   drop_path=rates[i], score_memory=score_memory, fused=self.fused_attn)
            for i in range(depth)
        ])
        self.pyramid = SimpleFeaturePyramid(dim, self.out_indices)
        self.num_features = self.pyramid.out_channels
        self._add_output_norms(eps=1e-6)
        self._freeze_stages()

    def _default_init(self):
        trunc_normal_(self.pos_embed, std=.02)
        init_transformer_weights(self)

    def _position_embedding(self, height: int, width: int) -> Tensor:
        """(1, height, width, C): the learned grid, bicubically resized to the token grid (a copy at its own size:
        an `if` on the sizes instead would fix an exported graph to the export size's branch)."""
        pos = self.pos_embed.reshape(1, *self.pos_grid, -1).permute(0, 3, 1, 2)
        return F.interpolate(pos, size=(height, width), mode='bicubic', align_corners=False).permute(0, 2, 3, 1)

    def forward(self, x: Tensor) -> Tuple[Tensor, ...]:
        """(B, C_in, H, W) -> tuple of (B, num_features[i], ceil(H / s_i), ceil(W / s_i)), s = 4/8/16/32."""
        self._check_input(x)
        H, W = x.shape[-2:]
        x = self.patch_embed(x)
        x = x + self._position_embedding(x.shape[1], x.shape[2])
        carried = ScoreFactors(run=self.fold_every) if self.score_memory == 'factors' else None
        for block in self.blocks:
            x, carried = checkpoint(block, x, carried, self.alpha, enabled=self.with_cp)
        levels = self.pyramid(x.permute(0, 3, 1, 2))
        outs = []
        for i in self.out_indices:
            # ceil(H / stride) for stride = patch / scale, in integers: a float of the sizes would be a symbolic
            # float under torch.compile(dynamic=True)
            num, den = PYRAMID_SCALES[i].as_integer_ratio()
            step = self.patch_size * den
            rows, cols = (H * num + step - 1) // step, (W * num + step - 1) // step
            outs.append(self._output(i, levels[i][..., :rows, :cols].permute(0, 2, 3, 1)))
        return tuple(outs)

    def _layer_order(self) -> LayerOrder:
        yield from (('patch_embed', False), ('pos_embed', False))
        yield from ((f'blocks.{i}', True) for i in range(len(self.blocks)))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # Checkpoints trained at another resolution (e.g. 384: 24x24 tokens) carry another square grid.
        key = prefix + 'pos_embed'
        pos = state_dict.get(key)
        if pos is not None and pos.dim() == 3 and pos.shape[1] != self.pos_embed.shape[1]:
            side = math.isqrt(pos.shape[1])
            if side * side == pos.shape[1]:
                grid = pos.reshape(1, side, side, -1).permute(0, 3, 1, 2).float()
                grid = F.interpolate(grid, size=self.pos_grid, mode='bicubic', align_corners=False)
                state_dict[key] = grid.permute(0, 2, 3, 1).reshape(1, -1, pos.shape[-1]).to(pos.dtype)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


# ---------------------------------------------------------------------------------------------------------
# Checkpoints: official ReViT-B, timm ViT (-> ReViT); official MViTv2 / ReMViTv2, timm MViTv2 (-> ReMViTv2);
# mmvisatt (mm-style) files of both.
# ---------------------------------------------------------------------------------------------------------
# A block with any of these is MViT-style pooling attention; plain ViT blocks have none.
_POOLING_KEYS = ('attn.pool_q.weight', 'attn.pool_k.weight', 'attn.rel_pos_h')


def _has_pooling(keys, block: str) -> bool:
    return any(block + k in keys for k in _POOLING_KEYS)


def _is_plain_vit(keys) -> bool:
    return 'blocks.0.attn.qkv.weight' in keys and 'pos_embed' in keys and not _has_pooling(keys, 'blocks.0.')


def _revit_is_mm(keys: Set[str]) -> bool:
    return _is_plain_vit(keys) and 'norm.weight' not in keys and 'cls_token' not in keys


@register_converter('revit', is_mm=_revit_is_mm)
def convert_revit_checkpoint(state_dict: Dict[str, Tensor], prefixed: bool) -> Optional[Tuple[Dict[str, Tensor], str]]:
    """Official ReViT-B or timm ViT keys -> mm-style ReViT keys.

    timm ViTs have a class token: it is dropped and its row of the position embedding removed (ReViT pools the
    mean token), so a timm ViT-B/16 initialises ReViT-B apart from ``alpha``. The final ``norm`` becomes
    ``norm2``, the stride-16 output norm.
    """
    keys = set(state_dict)
    if prefixed or not _is_plain_vit(keys):
        return None
    official = 'alpha' in keys or 'head.projection.weight' in keys
    out = {}
    for key, value in state_dict.items():
        if key in ('cls_token', 'dist_token'):
            continue
        if key == 'pos_embed':
            # rows before the square grid belong to the prefix (class / distillation) tokens
            value = value[:, value.shape[1] - math.isqrt(value.shape[1]) ** 2:]
        if key.startswith('head.'):
            out[head_key(key)] = value
            continue
        out['backbone.' + final_norm_key(key, 2)] = value
    return out, 'official-revit' if official else 'timm-vit'
