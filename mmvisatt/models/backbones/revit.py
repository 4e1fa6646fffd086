"""ReViT: vision transformers with attention residual connections (Diko et al., arXiv 2402.11301).

Each attention layer mixes its pre-softmax scores with the previous layer's,
``S_l = alpha * (q k^T / sqrt(d) + B) + (1 - alpha) * S_{l-1}``, with one learnable scalar ``alpha`` for the
whole network. This file holds ReSwin (the idea on Swin's shifted-window attention); how scores are carried
across windows and stages lives in :mod:`mmvisatt.models.layers.residual_attention`.
"""
import re
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint as cp
from mmengine.model import BaseModule
from mmengine.registry import MODELS
from timm.layers import DropPath, Mlp, trunc_normal_
from torch import Tensor
from torch.nn.modules.batchnorm import _BatchNorm

from mmvisatt.checkpoint import load_pretrained, register_converter
from ..layers.residual_attention import ALIGNERS, WindowScores, mix_scores
from ..layers.window import (WindowGrid, merge_windows, partition_windows, relative_position_index,
                             window_attention_mask)


class WindowResidualAttention(nn.Module):
    """Window multi-head self-attention whose scores are mixed with the previous layer's.

    There is no fused (scaled_dot_product_attention) path: the mixed scores must be materialised anyway to be
    carried to the next layer.
    """

    def __init__(self, dim: int, num_heads: int, window_size: int, qkv_bias: bool = True,
                 attn_drop: float = 0., proj_drop: float = 0.):
        super().__init__()
        self.num_heads = num_heads
        self.window_size = window_size
        self.scale = (dim // num_heads) ** -0.5
        self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * window_size - 1) ** 2, num_heads))
        self.register_buffer('relative_position_index', relative_position_index(window_size), persistent=False)
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def relative_position_bias(self) -> Tensor:
        N = self.window_size ** 2
        bias = self.relative_position_bias_table[self.relative_position_index.view(-1)]
        return bias.view(N, N, -1).permute(2, 0, 1)

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

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # Checkpoints trained with another window size (e.g. 12 at 384 px) carry a table of another length.
        key = prefix + 'relative_position_bias_table'
        table = state_dict.get(key)
        if table is not None and table.shape != self.relative_position_bias_table.shape:
            state_dict[key] = resize_relative_position_table(table, 2 * self.window_size - 1)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


def resize_relative_position_table(table: Tensor, size: int) -> Tensor:
    """Bicubically resize a ((2M-1)**2, heads) table to (size**2, heads)."""
    old = int(table.shape[0] ** 0.5)
    grid = table.t().reshape(1, -1, old, old).float()
    grid = F.interpolate(grid, size=(size, size), mode='bicubic', align_corners=False)
    return grid.reshape(-1, size * size).t().to(table.dtype)


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


class PatchMerging(nn.Module):
    """2x2 neighbourhood concat -> LayerNorm -> linear 4C -> 2C, padding odd sizes (Swin's order of the four)."""

    def __init__(self, dim: int, out_dim: Optional[int] = None):
        super().__init__()
        self.norm = nn.LayerNorm(4 * dim)
        self.reduction = nn.Linear(4 * dim, out_dim or 2 * dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        """(B, H, W, C) -> (B, ceil(H/2), ceil(W/2), out_dim)."""
        B, H, W, C = x.shape
        x = F.pad(x, (0, 0, 0, W % 2, 0, H % 2))
        x = torch.cat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], dim=-1)
        return self.reduction(self.norm(x))


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
            if self.with_cp and x.requires_grad:
                x, residual = cp.checkpoint(block, x, residual, alpha, use_reentrant=False)
            else:
                x, residual = block(x, residual, alpha)
        return x, residual


class PatchEmbed(nn.Module):
    """Non-overlapping patch projection (conv k=s=patch) + LayerNorm, padding inputs to a multiple of the patch."""

    def __init__(self, in_channels: int, embed_dims: int, patch_size: int):
        super().__init__()
        self.patch_size = patch_size
        self.proj = nn.Conv2d(in_channels, embed_dims, patch_size, patch_size)
        self.norm = nn.LayerNorm(embed_dims)

    def forward(self, x: Tensor) -> Tensor:
        """(B, C_in, H, W) -> (B, ceil(H/p), ceil(W/p), C)."""
        p = self.patch_size
        x = F.pad(x, (0, -x.shape[-1] % p, 0, -x.shape[-2] % p))
        return self.norm(self.proj(x).permute(0, 2, 3, 1))


@MODELS.register_module()
class ReSwinTransformer(BaseModule):
    """ReSwin: Swin Transformer with residual attention scores, as a multi-scale backbone.

    Args:
        arch: 't', 's', 'b' (Swin-T/S/B shapes, also 'reswin_t' etc.) or a dict with ``embed_dims``,
            ``depths`` and ``num_heads``.
        residual_mode: ``'aligned'`` (default) carries scores by image position with a learnable ``alpha``;
            ``'official'`` reproduces ADiko1997/ReViT ``model/reswin.py`` (constant 0.5 mix, slot-wise nearest
            resize, no ``alpha`` parameter) so the released checkpoint keeps its meaning.
        alpha_init: initial value of the learnable gate (``'aligned'`` mode only).
        out_indices: stages whose (normalised) outputs are returned, strides 4/8/16/32.
        frozen_stages: stages (and the patch embedding, and alpha once any stage is frozen) kept in eval mode
            without gradients; -1 freezes nothing, 0 only the patch embedding.
        norm_eval: keep normalisation layers in eval mode while training (only matters for BatchNorm).
        with_cp: activation checkpointing per block.
    """
    arch_zoo: Dict[str, dict] = {
        't': dict(embed_dims=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24)),
        's': dict(embed_dims=96, depths=(2, 2, 18, 2), num_heads=(3, 6, 12, 24)),
        'b': dict(embed_dims=128, depths=(2, 2, 18, 2), num_heads=(4, 8, 16, 32)),
    }
    # Keys that foreign (official, timm, classification) checkpoints cannot have.
    new_keys = ('alpha', 'norm0.*', 'norm1.*', 'norm2.*')

    def __init__(self, arch: Union[str, dict] = 't', in_channels: int = 3, patch_size: int = 4,
                 window_size: int = 7, mlp_ratio: float = 4., qkv_bias: bool = True, drop_rate: float = 0.,
                 attn_drop_rate: float = 0., drop_path_rate: float = 0.1, residual_mode: str = 'aligned',
                 alpha_init: float = 0.5, out_indices: Sequence[int] = (0, 1, 2, 3), frozen_stages: int = -1,
                 norm_eval: bool = False, with_cp: bool = False, init_cfg: Optional[dict] = None):
        super().__init__(init_cfg=init_cfg)
        arch = self._resolve_arch(arch)
        if residual_mode not in ALIGNERS:
            raise ValueError(f"residual_mode must be one of {sorted(ALIGNERS)}, got '{residual_mode}'")
        depths, heads = arch['depths'], arch['num_heads']
        num_stages = len(depths)
        out_indices = tuple(i % num_stages for i in out_indices)
        if any(i >= num_stages for i in out_indices):
            raise ValueError(f'out_indices {out_indices} out of range for {num_stages} stages')
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
        rates = torch.linspace(0, drop_path_rate, sum(depths)).tolist()
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
        if isinstance(arch, dict):
            missing = {'embed_dims', 'depths', 'num_heads'} - set(arch)
            if missing:
                raise ValueError(f'arch dict needs {sorted(missing)}')
            if len(arch['depths']) != len(arch['num_heads']):
                raise ValueError('arch depths and num_heads must have one entry per stage')
            return dict(arch)
        key = arch.lower().replace('reswin_', '').replace('reswin-', '')
        key = {'tiny': 't', 'small': 's', 'base': 'b'}.get(key, key)
        if key not in cls.arch_zoo:
            raise ValueError(f"Unknown ReSwinTransformer arch '{arch}'; choose one of "
                             f"{sorted(cls.arch_zoo)} (or reswin_t/s/b, tiny/small/base) or pass a dict.")
        return dict(cls.arch_zoo[key])

    def init_weights(self):
        if isinstance(self.init_cfg, dict) and self.init_cfg.get('type') == 'Pretrained':
            load_pretrained(self, self.init_cfg['checkpoint'], family='reswin', allow_missing=self.new_keys)
            self._is_init = True
            return
        if self.init_cfg is not None:
            super().init_weights()
            return
        for m in self.modules():
            if isinstance(m, nn.Linear):
                trunc_normal_(m.weight, std=.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, WindowResidualAttention):
                trunc_normal_(m.relative_position_bias_table, std=.02)

    def _check_input(self, x: Tensor) -> None:
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(f'{type(self).__name__} expects images of shape (B, {self.in_channels}, H, W), got '
                             f'{tuple(x.shape)}; set in_channels={x.shape[1] if x.dim() == 4 else "?"} in the '
                             f'backbone config if the data really has that many channels.')
        if min(x.shape[-2:]) < self.patch_size:
            raise ValueError(f'{type(self).__name__} needs images of at least {self.patch_size}x'
                             f'{self.patch_size} pixels (its patch size), got {tuple(x.shape[-2:])}; '
                             f'resize or pad the input.')

    def forward(self, x: Tensor) -> Tuple[Tensor, ...]:
        """(B, C, H, W) -> tuple of (B, C_i, ceil(H / 2**(i+2)), ceil(W / 2**(i+2))) for ``out_indices``."""
        self._check_input(x)
        x = self.pos_drop(self.patch_embed(x))
        residual = None
        outs = []
        for i, stage in enumerate(self.stages):
            x, residual = stage(x, residual, self.alpha)
            if i in self.out_indices:
                outs.append(getattr(self, f'norm{i}')(x).permute(0, 3, 1, 2).contiguous())
        return tuple(outs)

    def _freeze_stages(self):
        if self.frozen_stages < 0:
            return
        frozen = [self.patch_embed] + [self.stages[i] for i in range(min(self.frozen_stages, len(self.stages)))]
        frozen += [getattr(self, f'norm{i}') for i in range(self.frozen_stages) if i in self.out_indices]
        for module in frozen:
            module.eval()
            for p in module.parameters():
                p.requires_grad = False
        if self.frozen_stages >= 1 and isinstance(self.alpha, nn.Parameter):
            # alpha is shared by every layer, so frozen stages stay frozen only if it does
            self.alpha.requires_grad = False

    def train(self, mode: bool = True):
        super().train(mode)
        self._freeze_stages()
        if mode and self.norm_eval:
            for m in self.modules():
                if isinstance(m, (_BatchNorm, nn.GroupNorm, nn.LayerNorm)):
                    m.eval()
        return self


# ---------------------------------------------------------------------------------------------------------
# Checkpoints: official Swin / ReSwin release files, timm Swin, mmdet Swin and mmvisatt (mm-style) files.
# ---------------------------------------------------------------------------------------------------------
_DROPPED = ('relative_position_index', 'attn_mask')


def _from_mmdet_unfold_order(t: Tensor) -> Tensor:
    """mmdet's Swin merges patches with nn.Unfold: channel-major, neighbours in order [0, 2, 1, 3] of Swin's."""
    channels = t.shape[-1] // 4
    t = t.reshape(*t.shape[:-1], channels, 4).transpose(-1, -2)
    return t[..., [0, 2, 1, 3], :].reshape(*t.shape[:-2], 4 * channels)


@register_converter('reswin')
def convert_reswin_checkpoint(state_dict) -> Optional[Tuple[Dict[str, Tensor], str]]:
    """Official Swin/ReSwin, timm Swin, mmdet Swin or mmvisatt keys -> mm-style ReSwinTransformer keys."""
    keys = set(state_dict)
    if any(k.startswith('backbone.') for k in keys):
        inner = {k[len('backbone.'):]: v for k, v in state_dict.items() if k.startswith('backbone.')}
        heads = {k: v for k, v in state_dict.items() if k.startswith('head.')}
        if 'stages.0.blocks.0.attn.qkv.weight' in inner:
            return {**{'backbone.' + k: v for k, v in inner.items()}, **heads}, 'mmvisatt'
        if 'stages.0.blocks.0.attn.w_msa.qkv.weight' in inner:
            return _from_mmdet(inner), 'mmdet-swin'
        return None
    if 'stages.0.blocks.0.attn.qkv.weight' in keys:
        return {('' if k.startswith('head.') else 'backbone.') + k: v for k, v in state_dict.items()}, 'mmvisatt'
    if 'layers.0.blocks.0.attn.qkv.weight' not in keys:
        return None
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
