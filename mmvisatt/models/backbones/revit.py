"""ReViT: vision transformers with attention residual connections (Diko et al., arXiv 2402.11301).

Each attention layer mixes its pre-softmax scores with the previous layer's,
``S_l = alpha * (q k^T / sqrt(d) + B) + (1 - alpha) * S_{l-1}``, with one learnable scalar ``alpha`` for the
whole network. This file holds the three bases of the paper: ReSwin (Swin's shifted-window attention), ReViT
(plain ViT-B/16, with a ViTDet simple feature pyramid for dense tasks) and ReMViTv2 (MViTv2's pooling
attention). How scores are carried across windows, stages and pooled grids lives in
:mod:`mmvisatt.models.layers.residual_attention`.
"""
import math
import re
from typing import Dict, Optional, Sequence, Set, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.registry import MODELS
from timm.layers import DropPath, Mlp, trunc_normal_
from torch import Tensor

from mmvisatt.checkpoint import CheckpointMismatchError, register_converter
from mmvisatt.checkpoint.loading import abbreviate
from ..layers.attention import resolve_fused_attn
from ..layers.checkpoint import checkpoint
from ..layers.patch import PatchEmbed, PatchMerging
from ..layers.pooling_attention import PoolingResidualAttention
from ..layers.residual_attention import (ALIGNERS, POOLED_ALIGNERS, PooledScores, ScoreFactors, WindowScores,
                                         mix_scores)
from ..layers.simple_pyramid import PYRAMID_SCALES, SimpleFeaturePyramid
from ..layers.window import WindowAttentionBase, WindowGrid, merge_windows, partition_windows, window_attention_mask
from .base import AttentionBackbone, LayerOrder, drop_path_rates, init_transformer_weights, stage_layer_order


class WindowResidualAttention(WindowAttentionBase):
    """Window multi-head self-attention whose scores are mixed with the previous layer's.

    There is no fused (scaled_dot_product_attention) path: the mixed scores must be materialised anyway to be
    carried to the next layer.
    """

    def __init__(self, dim: int, num_heads: int, window_size: int, qkv_bias: bool = True,
                 attn_drop: float = 0., proj_drop: float = 0.):
        super().__init__(num_heads, window_size)
        self.scale = (dim // num_heads) ** -0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: Tensor, num_windows: int, mask: Optional[Tensor] = None,
                residual: Optional[Tensor] = None, residual_valid: Optional[Tensor] = None,
                alpha: Union[Tensor, float] = 0.5) -> Tuple[Tensor, Tensor]:
        """x: (B * num_windows, N, C); mask: (num_windows, N, N); residual: (B * num_windows, heads or 1, N, N).

        Returns the output (B * num_windows, N, C) and the mixed pre-mask scores to carry on.
        """
        BW, N, C = x.shape
        q, k, v = self.qkv(x).reshape(BW, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        scores = (q * self.scale) @ k.transpose(-2, -1) + self.relative_position_bias()
        scores = mix_scores(scores, residual, residual_valid, alpha, num_windows)
        attn = scores
        if mask is not None:
            # the residual never carries the mask: each layer masks by its own partition
            attn = (scores.unflatten(0, (-1, num_windows)) + mask[None, :, None]).flatten(0, 1)
        attn = self.attn_drop(attn.softmax(dim=-1))
        x = (attn @ v).transpose(1, 2).reshape(BW, N, C)
        return self.proj_drop(self.proj(x)), scores


class ReSwinBlock(nn.Module):
    """Swin block (W-MSA or SW-MSA + MLP) with residual attention scores."""

    def __init__(self, dim: int, num_heads: int, window_size: int = 7, shifted: bool = False,
                 mlp_ratio: float = 4., qkv_bias: bool = True, drop: float = 0., attn_drop: float = 0.,
                 drop_path: float = 0., residual_mode: str = 'aligned'):
        super().__init__()
        self.window_size = window_size
        self.shift = window_size // 2 if shifted else 0
        self.align = ALIGNERS[residual_mode]
        self.norm1 = nn.LayerNorm(dim)
        self.attn = WindowResidualAttention(dim, num_heads, window_size, qkv_bias, attn_drop, drop)
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


class ReSwinStage(nn.Module):
    """Optional patch merging followed by ``depth`` blocks alternating W-MSA and SW-MSA."""

    def __init__(self, in_dim: int, dim: int, depth: int, num_heads: int, downsample: bool,
                 drop_path: Sequence[float], with_cp: bool = False, **block_kwargs):
        super().__init__()
        self.with_cp = with_cp
        self.downsample = PatchMerging(in_dim, dim) if downsample else nn.Identity()
        self.blocks = nn.ModuleList([
            ReSwinBlock(dim, num_heads, shifted=i % 2 == 1, drop_path=drop_path[i], **block_kwargs)
            for i in range(depth)
        ])

    def forward(self, x: Tensor, residual: Optional[WindowScores],
                alpha: Union[Tensor, float]) -> Tuple[Tensor, Optional[WindowScores]]:
        x = self.downsample(x)
        for block in self.blocks:
            x, residual = checkpoint(block, x, residual, alpha, enabled=self.with_cp)
        return x, residual


def _stage_outputs(model: AttentionBackbone, x: Tensor, *stage_args) -> Tuple[Tensor, ...]:
    """Run ``model.stages`` carrying the residual scores; the normalised NCHW outputs of ``out_indices``."""
    residual, outs = None, []
    for i, stage in enumerate(model.stages):
        x, residual = stage(x, residual, model.alpha, *stage_args)
        if i in model.out_indices:
            outs.append(getattr(model, f'norm{i}')(x).permute(0, 3, 1, 2).contiguous())
    return tuple(outs)


def _freeze_staged(model: AttentionBackbone) -> None:
    """The stem, the first ``frozen_stages`` stages with their output norms, and alpha from one frozen stage on
    (alpha is shared by every layer, so frozen stages stay frozen only if it does)."""
    if model.frozen_stages < 0:
        return
    frozen = [model.patch_embed, *model.stages[:model.frozen_stages]]
    model._freeze(frozen + [getattr(model, f'norm{i}') for i in range(model.frozen_stages) if i in model.out_indices])
    if model.frozen_stages >= 1 and isinstance(model.alpha, nn.Parameter):
        model.alpha.requires_grad = False


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
        alpha_init: initial value of the learnable gate (``'aligned'`` mode only).
        out_indices: stages whose (normalised) outputs are returned, strides 4/8/16/32.
        frozen_stages: stages (and the patch embedding, and alpha once any stage is frozen) kept in eval mode
            without gradients; -1 freezes nothing, 0 only the patch embedding.
        norm_eval: keep normalisation layers in eval mode while training (only matters for BatchNorm).
        with_cp: activation checkpointing per block.
    """
    arch_zoo: Dict[str, dict] = {
        't': dict(embed_dims=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24), residual_mode='official'),
        's': dict(embed_dims=96, depths=(2, 2, 18, 2), num_heads=(3, 6, 12, 24)),
        'b': dict(embed_dims=128, depths=(2, 2, 18, 2), num_heads=(4, 8, 16, 32)),
    }
    _arch_keys = ('embed_dims', 'depths', 'num_heads')
    _arch_prefix = 'reswin'
    # Keys that foreign (official, timm, classification) checkpoints cannot have.
    new_keys = ('alpha', 'norm0.*', 'norm1.*', 'norm2.*')
    static_export_shapes = ('the window padding, shift mask and residual-score index maps are built from the map '
                            'size in Python, so torch.export fixes the size')

    def __init__(self, arch: Union[str, dict] = 't', in_channels: int = 3, patch_size: int = 4,
                 window_size: int = 7, mlp_ratio: float = 4., qkv_bias: bool = True, drop_rate: float = 0.,
                 attn_drop_rate: float = 0., drop_path_rate: float = 0.1, residual_mode: Optional[str] = None,
                 alpha_init: float = 0.5, out_indices: Sequence[int] = (0, 1, 2, 3), frozen_stages: int = -1,
                 norm_eval: bool = False, with_cp: bool = False, init_cfg: Optional[dict] = None):
        super().__init__(init_cfg=init_cfg)
        arch = self._resolve_arch(arch)
        if residual_mode is None:
            residual_mode = arch.get('residual_mode', 'aligned')
        if residual_mode not in ALIGNERS:
            raise ValueError(f"residual_mode must be one of {sorted(ALIGNERS)}, got '{residual_mode}'")
        depths, heads = arch['depths'], arch['num_heads']
        num_stages = len(depths)
        out_indices = self._check_out_indices(out_indices, num_stages)
        self.in_channels = in_channels
        self.patch_size = patch_size
        self.residual_mode = residual_mode
        self.out_indices = out_indices
        self.frozen_stages = frozen_stages
        self.norm_eval = norm_eval
        self.num_features = [arch['embed_dims'] * 2 ** i for i in range(num_stages)]

        self.patch_embed = PatchEmbed(in_channels, arch['embed_dims'], patch_size)
        self.pos_drop = nn.Dropout(drop_rate)
        if residual_mode == 'official':
            # the official code mixes with a constant; there is no parameter to learn or load
            self.alpha = 0.5
        else:
            self.alpha = nn.Parameter(torch.tensor([float(alpha_init)]))
        rates = drop_path_rates(drop_path_rate, sum(depths))
        self.stages = nn.ModuleList()
        for i in range(num_stages):
            start = sum(depths[:i])
            self.stages.append(
                ReSwinStage(self.num_features[max(i - 1, 0)], self.num_features[i], depths[i], heads[i],
                            downsample=i > 0, drop_path=rates[start:start + depths[i]], with_cp=with_cp,
                            window_size=window_size, mlp_ratio=mlp_ratio, qkv_bias=qkv_bias, drop=drop_rate,
                            attn_drop=attn_drop_rate, residual_mode=residual_mode))
        for i in out_indices:
            self.add_module(f'norm{i}', nn.LayerNorm(self.num_features[i]))
        self._freeze_stages()

    @classmethod
    def _resolve_arch(cls, arch: Union[str, dict]) -> dict:
        arch = super()._resolve_arch(arch)
        if len(arch['depths']) != len(arch['num_heads']):
            raise ValueError('arch depths and num_heads must have one entry per stage')
        return arch

    def init_weights(self):
        if self._init_from_cfg('reswin'):
            return
        init_transformer_weights(self, _init_position_tables)

    def forward(self, x: Tensor) -> Tuple[Tensor, ...]:
        """(B, C, H, W) -> tuple of (B, C_i, ceil(H / 2**(i+2)), ceil(W / 2**(i+2))) for ``out_indices``."""
        self._check_input(x)
        return _stage_outputs(self, self.pos_drop(self.patch_embed(x)))

    def _freeze_stages(self):
        _freeze_staged(self)

    def _layer_order(self) -> LayerOrder:
        # patch merging opens a stage but belongs to the layer of the block before it (mmpretrain's Swin rule)
        yield 'patch_embed', False
        yield from stage_layer_order(self.stages, before=('downsample', ))


# ---------------------------------------------------------------------------------------------------------
# ReViT (plain ViT) and ReMViTv2 (MViTv2): global and pooling attention with residual scores.
# ---------------------------------------------------------------------------------------------------------
class ReViTBlock(nn.Module):
    """Pre-norm transformer block with residual (pooling) attention: a ViT block, or an MViTv2 block with pooling.

    Where the width changes (MViTv2 changes it inside attention), the shortcut is a linear projection of the
    *normalised* input; where queries are strided, the shortcut is max-pooled with kernel stride + 1 (both as in
    MViTv2).
    """

    def __init__(self, dim: int, dim_out: int, num_heads: int, mlp_ratio: float = 4., qkv_bias: bool = True,
                 drop_path: float = 0., pool_kernel: Optional[Tuple[int, int]] = None,
                 stride_q: Tuple[int, int] = (1, 1), stride_kv: Tuple[int, int] = (1, 1),
                 rel_pos_size: Optional[int] = None, residual_pooling: bool = False, residual_mode: str = 'aligned',
                 fused_attn: bool = True, score_chunk_numel: Optional[int] = None):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = PoolingResidualAttention(dim, dim_out, num_heads, qkv_bias, pool_kernel, stride_q, stride_kv,
                                             rel_pos_size, residual_pooling, residual_mode, lean_scores=fused_attn,
                                             chunk_numel=score_chunk_numel)
        self.shortcut_proj = nn.Linear(dim, dim_out) if dim != dim_out else None
        if math.prod(stride_q) > 1:
            kernel = [s + 1 if s > 1 else s for s in stride_q]
            self.shortcut_pool = nn.MaxPool2d(kernel, stride_q, [k // 2 for k in kernel])
        else:
            self.shortcut_pool = None
        self.drop_path = DropPath(drop_path) if drop_path > 0. else nn.Identity()
        self.norm2 = nn.LayerNorm(dim_out, eps=1e-6)
        self.mlp = Mlp(dim_out, int(dim_out * mlp_ratio), act_layer=nn.GELU)

    def forward(self, x: Tensor, residual: Union[PooledScores, ScoreFactors, None], alpha: Union[Tensor, float],
                handoff: bool = False) -> Tuple[Tensor, Union[PooledScores, ScoreFactors]]:
        """x: (B, H, W, C) -> (B, H_q, W_q, C_out), plus what this layer carries on (see the attention)."""
        x_norm = self.norm1(x)
        out, scores = self.attn(x_norm, residual, alpha, handoff)
        shortcut = x if self.shortcut_proj is None else self.shortcut_proj(x_norm)
        if self.shortcut_pool is not None:
            shortcut = self.shortcut_pool(shortcut.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
        x = shortcut + self.drop_path(out)
        x = x + self.drop_path(self.mlp(self.norm2(x)))
        return x, scores


Carried = Union[PooledScores, ScoreFactors, None]


def _run_blocks(blocks: Sequence[nn.Module], x: Tensor, residual: Carried, alpha: Union[Tensor, float],
                with_cp: bool, handoff: bool = False) -> Tuple[Tensor, Carried]:
    for block in blocks:
        x, residual = checkpoint(block, x, residual, alpha, handoff, enabled=with_cp)
    return x, residual


def _make_alpha(alpha_init: float, learnable: bool) -> Union[nn.Parameter, float]:
    # One gate for the whole network, used raw (no sigmoid or clamp), as in the official code.
    return nn.Parameter(torch.tensor([float(alpha_init)])) if learnable else float(alpha_init)


def _init_position_tables(m: nn.Module) -> None:
    if isinstance(m, WindowResidualAttention):
        trunc_normal_(m.relative_position_bias_table, std=.02)
    elif isinstance(m, PoolingResidualAttention) and m.rel_pos_h is not None:
        trunc_normal_(m.rel_pos_h, std=.02)
        trunc_normal_(m.rel_pos_w, std=.02)


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
        alpha_init: initial value of the residual gate; ``learnable_alpha=False`` keeps it a constant.
        out_indices: pyramid levels returned, 0..3 = strides 4/8/16/32 (for patch size 16).
        frozen_stages: -1 freezes nothing; 0 the patch and position embeddings; n > 0 also the first n blocks
            and alpha.
        norm_eval: keep normalisation layers in eval mode while training. with_cp: checkpoint each block.
        carry_factors: carry the residual scores between blocks as per-block queries and keys
            (:class:`~mmvisatt.models.layers.residual_attention.ScoreFactors`) instead of one N x N score map per
            block, in training and inference alike. The maps are block outputs, so checkpointing cannot drop them,
            and at 800x1216 they are most of ReViT-B's training memory; factors cost O(N) each but widen the score
            product by ``head_dim`` per block. False (default): the score maps, the reference. Values equal the
            map path's up to rounding.
        factor_run: with factors, fold them into one stored score map every ``factor_run`` blocks (the folding
            block makes its map anyway), which bounds the product's width; None never stores a map (least
            memory, most compute).
        fused_attn: the lean score path (True; ``PoolingResidualAttention(lean_scores=True)``) or the plain
            autograd composition of the same ops (False, the reference); None takes the global default
            (:mod:`~mmvisatt.models.layers.attention`).
        score_chunk_numel: score elements per row chunk of the lean, factor and handoff paths (they bound the
            softmax's temporaries); None (default) takes the device's default,
            :func:`~mmvisatt.models.layers.lean_scores.default_chunk_numel` (16 MiB of float32 on a CPU, 256 MiB
            elsewhere; docs/performance.md). Values do not depend on it beyond summation order.
    """
    arch_zoo = {'b': dict(embed_dims=768, depth=12, num_heads=12)}
    _arch_keys = ('embed_dims', 'depth', 'num_heads')
    _arch_prefix = 'revit'
    # Keys that official / timm (classification) checkpoints cannot have.
    new_keys = ('alpha', 'norm0.*', 'norm1.*', 'norm3.*', 'pyramid.*')

    def __init__(self, arch: Union[str, dict] = 'b', in_channels: int = 3, img_size: int = 224,
                 patch_size: int = 16, mlp_ratio: float = 4., qkv_bias: bool = True, drop_path_rate: float = 0.1,
                 alpha_init: float = 0.5, learnable_alpha: bool = True, out_indices: Sequence[int] = (0, 1, 2, 3),
                 frozen_stages: int = -1, norm_eval: bool = False, with_cp: bool = False,
                 carry_factors: bool = False, factor_run: Optional[int] = 3,
                 fused_attn: Optional[bool] = None, score_chunk_numel: Optional[int] = None,
                 init_cfg: Optional[dict] = None):
        super().__init__(init_cfg=init_cfg)
        arch = self._resolve_arch(arch)
        dim, depth = arch['embed_dims'], arch['depth']
        if not isinstance(carry_factors, bool):
            raise ValueError(f'carry_factors must be True or False, got {carry_factors!r}')
        if factor_run is not None and factor_run < 1:
            raise ValueError(f'factor_run must be a positive number of blocks, or None never to fold, got '
                             f'{factor_run}')
        self.carry_factors = carry_factors
        self.factor_run = factor_run
        self.fused_attn = resolve_fused_attn(fused_attn)
        self.in_channels = in_channels
        self.patch_size = patch_size
        self.out_indices = self._check_out_indices(out_indices, len(PYRAMID_SCALES))
        self.frozen_stages = frozen_stages
        self.norm_eval = norm_eval
        self.with_cp = with_cp

        self.patch_embed = PatchEmbed(in_channels, dim, patch_size, norm=False)
        self.pos_grid = (img_size // patch_size, img_size // patch_size)
        self.pos_embed = nn.Parameter(torch.zeros(1, self.pos_grid[0] * self.pos_grid[1], dim))
        self.alpha = _make_alpha(alpha_init, learnable_alpha)
        rates = drop_path_rates(drop_path_rate, depth)
        self.blocks = nn.ModuleList([
            ReViTBlock(dim, dim, arch['num_heads'], mlp_ratio, qkv_bias, drop_path=rates[i],
                       fused_attn=self.fused_attn, score_chunk_numel=score_chunk_numel) for i in range(depth)
        ])
        self.pyramid = SimpleFeaturePyramid(dim, self.out_indices)
        self.num_features = self.pyramid.out_channels
        for i in self.out_indices:
            self.add_module(f'norm{i}', nn.LayerNorm(self.num_features[i], eps=1e-6))
        self._freeze_stages()

    def init_weights(self):
        if self._init_from_cfg('revit'):
            return
        trunc_normal_(self.pos_embed, std=.02)
        init_transformer_weights(self, _init_position_tables)

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
        carried = ScoreFactors(run=self.factor_run) if self.carry_factors else None
        x, _ = _run_blocks(self.blocks, x, carried, self.alpha, self.with_cp)
        levels = self.pyramid(x.permute(0, 3, 1, 2))
        outs = []
        for i in self.out_indices:
            # ceil(H / stride) for stride = patch / scale, in integers: a float of the sizes would be a symbolic
            # float under torch.compile(dynamic=True)
            num, den = PYRAMID_SCALES[i].as_integer_ratio()
            step = self.patch_size * den
            rows, cols = (H * num + step - 1) // step, (W * num + step - 1) // step
            level = levels[i][..., :rows, :cols]
            outs.append(getattr(self, f'norm{i}')(level.permute(0, 2, 3, 1)).permute(0, 3, 1, 2).contiguous())
        return tuple(outs)

    def _freeze_stages(self):
        if self.frozen_stages < 0:
            return
        self.pos_embed.requires_grad = False
        self._freeze([self.patch_embed, *self.blocks[:self.frozen_stages]])
        if self.frozen_stages >= 1 and isinstance(self.alpha, nn.Parameter):
            self.alpha.requires_grad = False

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


class ReMViTStage(nn.Module):
    """A run of ReViT blocks at one resolution; the first block strides the queries and widens the channels."""

    def __init__(self, blocks: Sequence[ReViTBlock], with_cp: bool = False):
        super().__init__()
        self.with_cp = with_cp
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x: Tensor, residual: Optional[PooledScores], alpha: Union[Tensor, float],
                handoff: bool = False) -> Tuple[Tensor, Optional[PooledScores]]:
        """(B, H, W, C_in) -> (B, H', W', C)."""
        return _run_blocks(self.blocks, x, residual, alpha, self.with_cp, handoff)


def _per_stage(value: Union[int, Sequence[int]], num_stages: int, name: str) -> Tuple[int, ...]:
    """An int is the first stage's value, doubled at every stage (MViTv2's rule); a sequence gives each stage's."""
    if isinstance(value, int):
        return tuple(value * 2 ** i for i in range(num_stages))
    if len(value) != num_stages:
        raise ValueError(f'arch {name} needs an int or one entry per stage ({num_stages}), got {value}')
    return tuple(value)


def _pair(value: Union[int, Sequence[int]]) -> Tuple[int, int]:
    return (value, value) if isinstance(value, int) else tuple(value)


@MODELS.register_module()
class ReMViTv2(AttentionBackbone):
    """ReMViTv2: MViTv2 with residual attention scores, as a multi-scale backbone (outputs at strides 4/8/16/32).

    Every block pools its queries (at stride 2 in the first block of stages 2-4, else 1) and its keys/values
    (at the adaptive stride) with depthwise convolutions; the residual scores are brought onto each block's
    query and key grids before the mix (``residual_mode``, see ``docs/residual_attention.md``). The outputs are
    the last block of each stage through its own LayerNorm ``norm{i}``; ``norm3`` is MViTv2's final norm.

    Args:
        arch: 't', 's', 'b' (MViTv2-T/S/B shapes; also 'remvit_t', 'tiny', ...) or a dict with ``depths`` (blocks
            per stage), ``embed_dims`` and ``num_heads`` (an int for the first stage, doubled per stage, or one
            value per stage).
        img_size: input size the relative-position tables are laid out for; other sizes interpolate them
            linearly to the grids they meet (as mmpretrain does), so any input size works.
        patch_cfg: the overlapping patch projection, default ``dict(kernel_size=7, stride=4, padding=3)``.
        pool_kernel: kernel of the query/key/value pooling convolutions.
        q_stride: query stride of the first block of every stage after the first.
        adaptive_kv_stride: key/value stride of the first stage; divided by each query stride (at least 1).
        rel_pos: decomposed relative positions. residual_pooling: add the pooled query to the attention output.
        residual_mode: ``'aligned'`` (default) resamples the carried scores on the real (H, W) query and key
            grids by their strides, for any input size; ``'official'`` reproduces ADiko1997/ReViT
            ``model/attention.py`` (square-grid logic), which only runs on square maps with sides divisible by
            the strides. Both give the same result there, e.g. at 224x224.
        alpha_init, learnable_alpha: the residual gate (a constant when not learnable).
        handoff: blocks whose scores the next block shrinks (pools their queries or keys, or averages their
            heads) hand them on already shrunk, row chunk by row chunk, and recompute ``q k^T`` in the backward
            instead of keeping their own map (``PoolingResidualAttention``'s handoff), in training and inference
            alike (``residual_mode='aligned'`` only; the official mode keeps the maps). False (default): the score
            maps, the reference. The dense and ImageNet configs set it (their training peak: docs/performance.md).
            The values are the same up to rounding.
        fused_attn: the lean score path (True) or the plain autograd composition of the same ops (False, the
            reference), as in :class:`ReViT`. score_chunk_numel: as in :class:`ReViT`.
        out_indices, frozen_stages, norm_eval, with_cp, drop_path_rate, init_cfg: as in ReSwinTransformer.
    """
    arch_zoo = {
        't': dict(embed_dims=96, depths=(1, 2, 5, 2), num_heads=1),
        's': dict(embed_dims=96, depths=(1, 2, 11, 2), num_heads=1),
        'b': dict(embed_dims=96, depths=(2, 3, 16, 3), num_heads=1),
    }
    _arch_keys = ('embed_dims', 'depths', 'num_heads')
    _arch_prefix = 'remvit'
    new_keys = ('alpha', 'norm0.*', 'norm1.*', 'norm2.*')

    def __init__(self, arch: Union[str, dict] = 't', in_channels: int = 3, img_size: int = 224,
                 patch_cfg: Optional[dict] = None, mlp_ratio: float = 4., qkv_bias: bool = True,
                 pool_kernel: Union[int, Sequence[int]] = 3, q_stride: Union[int, Sequence[int]] = 2,
                 adaptive_kv_stride: Union[int, Sequence[int]] = 4, rel_pos: bool = True,
                 residual_pooling: bool = True, drop_path_rate: float = 0.1, residual_mode: str = 'aligned',
                 alpha_init: float = 0.5, learnable_alpha: bool = True, out_indices: Sequence[int] = (0, 1, 2, 3),
                 frozen_stages: int = -1, norm_eval: bool = False, with_cp: bool = False,
                 handoff: bool = False, fused_attn: Optional[bool] = None,
                 score_chunk_numel: Optional[int] = None, init_cfg: Optional[dict] = None):
        super().__init__(init_cfg=init_cfg)
        arch = self._resolve_arch(arch)
        if not isinstance(handoff, bool):
            raise ValueError(f'handoff must be True or False, got {handoff!r}')
        if residual_mode not in POOLED_ALIGNERS:
            raise ValueError(f"residual_mode must be one of {sorted(POOLED_ALIGNERS)}, got '{residual_mode}'")
        depths = tuple(arch['depths'])
        num_stages = len(depths)
        dims = _per_stage(arch['embed_dims'], num_stages, 'embed_dims')
        heads = _per_stage(arch['num_heads'], num_stages, 'num_heads')
        if any(d % h for d, h in zip(dims, heads)):
            raise ValueError(f'arch embed_dims {dims} must be divisible by num_heads {heads} in every stage')
        patch = {**dict(kernel_size=7, stride=4, padding=3), **(patch_cfg or {})}
        self.in_channels = in_channels
        self.patch_size = patch['stride']
        self.residual_mode = residual_mode
        self.fused_attn = resolve_fused_attn(fused_attn)
        self.out_indices = self._check_out_indices(out_indices, num_stages)
        self.frozen_stages = frozen_stages
        self.norm_eval = norm_eval
        self.num_features = list(dims)

        self.patch_embed = PatchEmbed(in_channels, dims[0], patch['kernel_size'], patch['stride'],
                                      patch['padding'], norm=False)
        self.alpha = _make_alpha(alpha_init, learnable_alpha)
        kv_stride = _pair(adaptive_kv_stride)
        side = img_size // patch['stride']  # the build-time grid fixes the relative-position table lengths
        rates = iter(drop_path_rates(drop_path_rate, sum(depths)))
        in_dim = dims[0]
        self.stages = nn.ModuleList()
        for i, depth in enumerate(depths):
            blocks = []
            for j in range(depth):
                stride_q = _pair(q_stride) if i > 0 and j == 0 else (1, 1)
                kv_stride = tuple(max(k // q, 1) for k, q in zip(kv_stride, stride_q))
                rel_pos_size = 2 * max(side // stride_q[1], side // kv_stride[1]) - 1 if rel_pos else None
                blocks.append(
                    ReViTBlock(in_dim, dims[i], heads[i], mlp_ratio, qkv_bias, next(rates), _pair(pool_kernel),
                               stride_q, kv_stride, rel_pos_size, residual_pooling, residual_mode,
                               self.fused_attn, score_chunk_numel))
                side //= stride_q[1]
                in_dim = dims[i]
            self.stages.append(ReMViTStage(blocks, with_cp))
        self.handoff = handoff
        attns = [block.attn for stage in self.stages for block in stage.blocks]
        for attn, nxt in zip(attns, attns[1:]):
            attn.next_block = (nxt.stride_q, nxt.stride_kv, nxt.num_heads)
        for i in self.out_indices:
            self.add_module(f'norm{i}', nn.LayerNorm(dims[i], eps=1e-6))
        self._freeze_stages()

    def init_weights(self):
        if self._init_from_cfg('remvit'):
            return
        init_transformer_weights(self, _init_position_tables)

    def forward(self, x: Tensor) -> Tuple[Tensor, ...]:
        """(B, C_in, H, W) -> tuple of (B, num_features[i], ceil(H / 2**(i+2)), ceil(W / 2**(i+2)))."""
        self._check_input(x)
        return _stage_outputs(self, self.patch_embed(x), self.handoff)

    def _freeze_stages(self):
        _freeze_staged(self)

    def _layer_order(self) -> LayerOrder:
        yield 'patch_embed', False
        yield from stage_layer_order(self.stages)


# ---------------------------------------------------------------------------------------------------------
# Checkpoints: official Swin / ReSwin release files, timm Swin, mmdet Swin and mmvisatt (mm-style) files.
# ---------------------------------------------------------------------------------------------------------
_DROPPED = ('relative_position_index', 'attn_mask')
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
    out = {}
    for key, value in state_dict.items():
        if key.endswith(_DROPPED):
            continue
        if key.startswith('head.'):
            out['head.fc.' + key.split('.')[-1]] = value
            continue
        m = re.match(r'layers\.(\d+)\.downsample\.(.*)', key)
        if m:
            stage = int(m.group(1)) + (1 if official else 0)
            key = f'stages.{stage}.downsample.{m.group(2)}'
        else:
            key = re.sub(r'^layers\.', 'stages.', key)
            key = re.sub(r'^norm\.', f'norm{num_stages - 1}.', key)
        out['backbone.' + key] = value
    return out, 'official-swin' if official else 'timm-swin'


def _from_mmdet(inner: Dict[str, Tensor]) -> Dict[str, Tensor]:
    out = {}
    for key, value in inner.items():
        if key.endswith(_DROPPED):
            continue
        key = key.replace('patch_embed.projection.', 'patch_embed.proj.').replace('attn.w_msa.', 'attn.')
        key = key.replace('ffn.layers.0.0.', 'mlp.fc1.').replace('ffn.layers.1.', 'mlp.fc2.')
        m = re.match(r'stages\.(\d+)\.downsample\.(.*)', key)
        if m:
            key = f'stages.{int(m.group(1)) + 1}.downsample.{m.group(2)}'
            value = _from_mmdet_unfold_order(value)
        out['backbone.' + key] = value
    return out


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


def _head_key(key: str) -> str:
    # official ReViT/MViTv2: head.projection.*, timm ViT: head.*, timm MViTv2 and mm-style: head.fc.*
    return 'head.fc.' + key.split('.')[-1]


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
            out[_head_key(key)] = value
            continue
        out['backbone.' + re.sub(r'^norm\.', 'norm2.', key)] = value
    return out, 'official-revit' if official else 'timm-vit'


def _remvit_is_mm(keys: Set[str]) -> bool:
    return (_has_pooling(keys, 'stages.0.blocks.0.') and 'norm.weight' not in keys
            and not any('.shortcut_proj_attn.' in k for k in keys))


@register_converter('remvit', is_mm=_remvit_is_mm)
def convert_remvit_checkpoint(state_dict: Dict[str, Tensor], prefixed: bool) -> Optional[Tuple[Dict[str, Tensor], str]]:
    """Official MViTv2 (``.pyth``) / ReMViTv2 or timm MViTv2 keys -> mm-style ReMViTv2 keys.

    The official layout numbers blocks flatly (``blocks.{i}``); a stage starts at every block with a shortcut
    projection ``blocks.{i}.proj`` (MViTv2 widens the channels where it strides the queries).
    """
    keys = set(state_dict)
    if prefixed:
        return None
    if _has_pooling(keys, 'stages.0.blocks.0.'):
        return _from_timm_mvitv2(state_dict), 'timm-mvitv2'
    if not _has_pooling(keys, 'blocks.0.'):
        return None
    num_blocks = 1 + max(int(k.split('.')[1]) for k in keys if k.startswith('blocks.'))
    starts = [0] + [i for i in range(1, num_blocks) if f'blocks.{i}.proj.weight' in keys]
    place = {}
    for stage, (start, end) in enumerate(zip(starts, starts[1:] + [num_blocks])):
        place.update({i: (stage, i - start) for i in range(start, end)})
    out = {}
    for key, value in state_dict.items():
        if key.startswith('head.'):
            out[_head_key(key)] = value
            continue
        m = re.match(r'blocks\.(\d+)\.(.*)', key)
        if m:
            stage, index = place[int(m.group(1))]
            rest = re.sub(r'^proj\.', 'shortcut_proj.', m.group(2))
            key = f'stages.{stage}.blocks.{index}.{rest}'
        else:
            key = re.sub(r'^norm\.', f'norm{len(starts) - 1}.', key)
        out['backbone.' + key] = value
    return out, 'official-remvit' if 'alpha' in keys else 'official-mvitv2'


def _from_timm_mvitv2(state_dict) -> Dict[str, Tensor]:
    num_stages = 1 + max(int(k.split('.')[1]) for k in state_dict if k.startswith('stages.'))
    out = {}
    for key, value in state_dict.items():
        if key.startswith('head.'):
            out[_head_key(key)] = value
            continue
        key = key.replace('.shortcut_proj_attn.', '.shortcut_proj.')
        out['backbone.' + re.sub(r'^norm\.', f'norm{num_stages - 1}.', key)] = value
    return out
