"""ReSwin: Swin Transformer with attention residual connections (Diko et al., arXiv 2402.11301, ReViT section 3).

Each window attention mixes its pre-softmax scores with the previous layer's,
``S_l = alpha * (q k^T / sqrt(d) + B) + (1 - alpha) * S_{l-1}``, with one gate ``alpha`` for the whole network.
Windows shift and stages merge patches, so the previous scores are first brought onto this layer's window pairs
(:mod:`mmvisatt.models.layers.residual_attention`). Blocks, stage, backbone, then the checkpoint converter.
"""
import re
from functools import partial
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch.nn as nn
from mmengine.registry import MODELS
from timm.layers import DropPath, Mlp, trunc_normal_
from torch import Tensor

from mmvisatt.checkpoint import CheckpointMismatchError, register_converter
from mmvisatt.checkpoint.loading import abbreviate
from mmvisatt.checkpoint.renames import final_norm_key, is_rebuilt_buffer, rename_release, swin_layer_key
from ..layers.attention import resolve_fused_attn
from ..layers.helpers import check_choice
from ..layers.patch import PatchEmbed
from ..layers.residual_attention import ALIGNERS, WindowScores, make_alpha, residual_attention
from ..layers.swin_stage import SwinStage
from ..layers.window import WindowAttention, WindowGrid, merge_windows, partition_windows, window_attention_mask
from .base import AttentionBackbone, LayerOrder, init_transformer_weights, stage_layer_order


class WindowResidualAttention(WindowAttention):
    """Window multi-head self-attention whose scores are mixed with the previous layer's
    (:func:`~mmvisatt.models.layers.residual_attention.residual_attention`, ``fused`` choosing its path)."""

    def forward(self, x: Tensor, num_windows: int, mask: Optional[Tensor] = None,
                residual: Optional[Tensor] = None, residual_valid: Optional[Tensor] = None,
                alpha: Union[Tensor, float] = 0.5) -> Tuple[Tensor, Tensor]:
        """x: (B * num_windows, N, C); mask: (num_windows, N, N); residual: (B * num_windows, heads or 1, N, N);
        residual_valid: (num_windows, N, N) or None for all pairs.

        Returns the output (B * num_windows, N, C) and the mixed pre-mask scores to carry on.
        """
        BW, N, C = x.shape
        h = self.num_heads
        # (B, num_windows, heads, N, d): the per-window mask and validity broadcast over images and heads
        q, k, v = self.qkv(x).reshape(-1, num_windows, N, 3, h, C // h).permute(3, 0, 1, 4, 2, 5)
        prev = None if residual is None else residual.unflatten(0, (-1, num_windows))
        valid, mask = (None if t is None else t[:, None] for t in (residual_valid, mask))
        out, scores = residual_attention(q, k, v, prev, alpha, scale=(C // h) ** -0.5, valid=valid, mask=mask,
                                         bias=self.relative_position_bias(), fused=self.fused,
                                         dropout=self.attn_drop.p if self.training else 0.)
        return self.proj_drop(self.proj(out.transpose(2, 3).reshape(BW, N, C))), scores.flatten(0, 1)


class ReSwinBlock(nn.Module):
    """Swin block (W-MSA or SW-MSA + MLP) with residual attention scores."""

    def __init__(self, dim: int, num_heads: int, *, window_size: int = 7, shifted: bool = False,
                 mlp_ratio: float = 4., qkv_bias: bool = True, drop: float = 0., attn_drop: float = 0.,
                 drop_path: float = 0., residual_mode: str = 'aligned', fused: bool = True):
        super().__init__()
        self.window_size = window_size
        self.shift = window_size // 2 if shifted else 0
        self.align = ALIGNERS[residual_mode]
        self.norm1 = nn.LayerNorm(dim)
        self.attn = WindowResidualAttention(dim, num_heads, window_size, qkv_bias=qkv_bias, attn_drop=attn_drop,
                                            proj_drop=drop, fused=fused)
        self.drop_path = DropPath(drop_path) if drop_path > 0. else nn.Identity()
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=nn.GELU, drop=drop)

    def forward(self, x: Tensor, residual: Optional[WindowScores],
                alpha: Union[Tensor, float]) -> Tuple[Tensor, WindowScores]:
        """x: (B, H, W, C) -> (B, H, W, C), plus this layer's mixed scores."""
        B, H, W, C = x.shape
        grid = WindowGrid.build(H, W, self.window_size, self.shift)
        windows = partition_windows(self.norm1(x), grid)
        prev, valid = (None, None) if residual is None else self.align(residual, grid, B, self.attn.num_heads)
        mask = window_attention_mask(grid, x.device)
        if mask is not None:
            mask = mask.to(x.dtype)
        out, scores = self.attn(windows, grid.num_windows, mask, prev, valid, alpha)
        x = x + self.drop_path(merge_windows(out, grid))
        x = x + self.drop_path(self.mlp(self.norm2(x)))
        return x, WindowScores(scores, grid)


def _init_bias_table(m: nn.Module) -> None:
    if isinstance(m, WindowResidualAttention):
        trunc_normal_(m.relative_position_bias_table, std=.02)


@MODELS.register_module()
class ReSwinTransformer(AttentionBackbone):
    """ReSwin: Swin Transformer with residual attention scores, as a multi-scale backbone.

    Args:
        arch: 't', 's', 'b' (Swin-T/S/B shapes, also 'reswin_t' etc.) or a dict with ``embed_dims``,
            ``depths`` and ``num_heads``.
        residual_mode: ``'aligned'`` carries scores by image position with a learnable ``alpha``; ``'official'``
            reproduces ADiko1997/ReViT ``model/reswin.py`` (constant 0.5 mix, slot-wise nearest resize, no
            ``alpha`` parameter) so the released checkpoint keeps its meaning. None (default) takes the preset's:
            ``'official'`` for ``'t'``, whose released weights were trained that way, ``'aligned'`` for ``'s'``,
            ``'b'`` and arch dicts (which may name their own ``residual_mode``).
        out_indices: stages whose (normalised) outputs are returned, strides 4/8/16/32.
        frozen_stages: stages (and the patch embedding, and alpha once any stage is frozen) kept in eval mode
            without gradients; -1 freezes nothing, 0 only the patch embedding.
        norm_eval: keep normalisation layers in eval mode while training (only matters for BatchNorm).
        with_cp: activation checkpointing per block.
        fused_attn: ``scaled_dot_product_attention`` with the carried scores as its bias (True), or the explicit
            softmax (False, the reference the parity fixtures check); None takes timm's global setting. Where
            ``'aligned'`` mixes only the pairs the previous partition scored, both compute the mix explicitly.
    """
    arch_zoo: Dict[str, dict] = {
        't': dict(embed_dims=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24), residual_mode='official'),
        's': dict(embed_dims=96, depths=(2, 2, 18, 2), num_heads=(3, 6, 12, 24)),
        'b': dict(embed_dims=128, depths=(2, 2, 18, 2), num_heads=(4, 8, 16, 32)),
    }
    _arch_keys = ('embed_dims', 'depths', 'num_heads')
    _per_stage_keys = ('num_heads', )
    _arch_prefix = 'reswin'
    # Keys that foreign (official, timm, classification) checkpoints cannot have.
    not_in_pretrained = ('alpha', 'norm0.*', 'norm1.*', 'norm2.*')
    _stage_carries = True
    static_export_reason = ('the window padding, shift mask and residual-score index maps are built from the map '
                            'size in Python, so torch.export fixes the size')

    def __init__(self, arch: Union[str, dict] = 't', *, in_channels: int = 3, patch_size: int = 4,
                 window_size: int = 7, mlp_ratio: float = 4., qkv_bias: bool = True, drop_rate: float = 0.,
                 attn_drop_rate: float = 0., drop_path_rate: float = 0.1, residual_mode: Optional[str] = None,
                 out_indices: Sequence[int] = (0, 1, 2, 3), frozen_stages: int = -1,
                 norm_eval: bool = False, with_cp: bool = False, fused_attn: Optional[bool] = None,
                 init_cfg: Optional[dict] = None):
        super().__init__(init_cfg=init_cfg)
        arch = self._resolve_arch(arch)
        if residual_mode is None:
            residual_mode = arch.get('residual_mode', 'aligned')
        self.residual_mode = check_choice('residual_mode', residual_mode, sorted(ALIGNERS))
        depths = arch['depths']
        num_stages = len(depths)
        self._set_interface(in_channels, out_indices, num_stages, frozen_stages, norm_eval)
        self.patch_size = patch_size
        self.fused_attn = resolve_fused_attn(fused_attn)
        self.num_features = [arch['embed_dims'] * 2 ** i for i in range(num_stages)]

        self.patch_embed = PatchEmbed(in_channels, arch['embed_dims'], patch_size)
        self.pos_drop = nn.Dropout(drop_rate)
        # the official code mixes with a constant: there is no parameter to learn or load
        self.alpha = make_alpha(learnable=residual_mode != 'official')
        self._build_stages(depths, drop_path_rate, heads=arch['num_heads'], with_cp=with_cp,
                           block=dict(window_size=window_size, mlp_ratio=mlp_ratio, qkv_bias=qkv_bias,
                                      drop=drop_rate, attn_drop=attn_drop_rate, residual_mode=residual_mode,
                                      fused=self.fused_attn))
        self._add_output_norms()
        self._freeze_stages()

    def _make_stage(self, i: int, drop_path: List[float], *, heads: Sequence[int], with_cp: bool,
                    block: dict) -> nn.Module:
        dims = self.num_features
        return SwinStage(dims[max(i - 1, 0)], dims[i], len(drop_path), downsample=i > 0, drop_path=drop_path,
                         make_block=partial(ReSwinBlock, dims[i], heads[i], **block), with_cp=with_cp)

    def _default_init(self):
        init_transformer_weights(self, _init_bias_table)

    def forward(self, x: Tensor) -> Tuple[Tensor, ...]:
        """(B, C, H, W) -> tuple of (B, C_i, ceil(H / 2**(i+2)), ceil(W / 2**(i+2))) for ``out_indices``."""
        self._check_input(x)
        return self._forward_stages(self.pos_drop(self.patch_embed(x)))

    def _layer_order(self) -> LayerOrder:
        # patch merging opens a stage but belongs to the layer of the block before it (mmpretrain's Swin rule)
        yield 'patch_embed', False
        yield from stage_layer_order(self.stages, before=('downsample', ))


# ---------------------------------------------------------------------------------------------------------
# Checkpoints: official Swin / ReSwin release files, timm Swin, mmdet Swin and mmvisatt (mm-style) files.
# ---------------------------------------------------------------------------------------------------------
# MViTv2 layouts (timm, ReMViTv2) also have 'stages.0.blocks.0.attn.qkv.weight'; the bias table is Swin's own.
_RESWIN_MM_KEY = 'stages.0.blocks.0.attn.relative_position_bias_table'


def _from_mmdet_unfold_order(t: Tensor) -> Tensor:
    """mmdet's Swin merges patches with nn.Unfold: channel-major, neighbours in order [0, 2, 1, 3] of Swin's."""
    channels = t.shape[-1] // 4
    t = t.reshape(*t.shape[:-1], channels, 4).transpose(-1, -2)
    return t[..., [0, 2, 1, 3], :].reshape(*t.shape[:-2], 4 * channels)


@register_converter('reswin', is_mm=lambda keys: _RESWIN_MM_KEY in keys)
def convert_reswin_checkpoint(state_dict: Dict[str, Tensor], prefixed: bool) -> Optional[Tuple[Dict[str, Tensor], str]]:
    """Official Swin/ReSwin, timm Swin or mmdet Swin (inside ``backbone.``) keys -> mm-style ReSwinTransformer
    keys."""
    keys = set(state_dict)
    if prefixed:
        return (_from_mmdet(state_dict), 'mmdet-swin') if 'stages.0.blocks.0.attn.w_msa.qkv.weight' in keys else None
    if 'layers.0.blocks.0.attn.qkv.weight' not in keys:
        return None
    v2 = sorted(k for k in keys if k.endswith(('attn.logit_scale', 'attn.cpb_mlp.0.weight')))
    if v2:
        raise CheckpointMismatchError(
            f'a Swin Transformer V2 checkpoint ({abbreviate(v2, 2)}: cosine attention with a learned logit scale and '
            f'a continuous position-bias MLP), not Swin (V1), which ReSwin extends: its weights would mean something '
            f'else here. Use a Swin V1 file, e.g. timm swin_tiny_patch4_window7_224 or the official '
            f'swin_tiny_patch4_window7_224.pth')
    # official and ReSwin put patch merging at the end of a stage, timm at the start of the next one
    official = 'layers.0.downsample.reduction.weight' in keys
    num_stages = 1 + max(int(k.split('.')[1]) for k in keys if k.startswith('layers.'))
    out = rename_release(state_dict, lambda key: final_norm_key(swin_layer_key(key, official), num_stages - 1))
    return out, 'official-swin' if official else 'timm-swin'


def _from_mmdet(inner: Dict[str, Tensor]) -> Dict[str, Tensor]:
    out = {}
    for key, value in inner.items():
        if is_rebuilt_buffer(key):
            continue
        key = key.replace('patch_embed.projection.', 'patch_embed.proj.').replace('attn.w_msa.', 'attn.')
        key = key.replace('ffn.layers.0.0.', 'mlp.fc1.').replace('ffn.layers.1.', 'mlp.fc2.')
        m = re.match(r'stages\.(\d+)\.downsample\.(.*)', key)
        if m:
            key = f'stages.{int(m.group(1)) + 1}.downsample.{m.group(2)}'
            value = _from_mmdet_unfold_order(value)
        out['backbone.' + key] = value
    return out
