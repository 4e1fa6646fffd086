"""FAN-Hybrid: FAN blocks on a ConvNeXt stem (Zhou et al., ICML 2022; the shared parts are in
:mod:`~mmvisatt.models.backbones.fan`).

The stem is ConvNeXt (a 4x4 stride-4 conv and LayerNorm2d, then stages at strides 4 and 8) and a 2x2 stride-2
projection to the FAN width (stride 16). The official detection layout returns the two ConvNeXt maps, the output
of one FAN block, and a stride-2 convolution of the patch tokens after the class-attention head (stride 32).
"""
from functools import partial
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.registry import MODELS
from timm.layers import LayerNorm2d, trunc_normal_
from timm.models.convnext import ConvNeXtStage
from torch import Tensor

from ..layers.patch import tokens_to_map
from .base import LayerOrder, stage_layer_order
from .fan import Size, _build_bn, _TokenFAN


# ---------------------------------------------------------------------------------------------------------
# The ConvNeXt stem
# ---------------------------------------------------------------------------------------------------------
class UnbiasedLayerNorm2d(LayerNorm2d):
    """timm's ``LayerNorm2d`` with the variance divided by C - 1: a numerical accident of the official hybrid stem
    (timm 0.5's LayerNorm2d falls back to ``torch.var_mean`` for channels_last-strided input, which every norm
    after the stem's receives), kept because the released weights were trained with it."""

    def forward(self, x: Tensor) -> Tensor:
        var, mean = torch.var_mean(x, dim=1, keepdim=True)
        x = (x - mean) * torch.rsqrt(var + self.eps)
        return x * self.weight[:, None, None] + self.bias[:, None, None]


class HybridEmbed(nn.Module):
    """FAN-Hybrid's stem: ConvNeXt (4x4 stride-4 conv + LayerNorm2d, then timm's ConvNeXt stages at strides 4 and
    8), then a 2x2 stride-2 conv to ``dim`` channels (stride 16).

    Every LayerNorm2d after the stem's divides the variance by C - 1, as the official code computes it (see
    :class:`UnbiasedLayerNorm2d`). The input is padded to a multiple of 16, so every map has ceil(H / stride) rows
    before the caller crops the padded margin off the ConvNeXt maps. ``with_cp`` checkpoints the ConvNeXt blocks:
    at strides 4 and 8 their activations are the largest of the network.
    """

    def __init__(self, in_channels: int, dim: int, depths: Sequence[int], dims: Sequence[int],
                 with_cp: bool = False):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(in_channels, dims[0], 4, 4), LayerNorm2d(dims[0]))
        self.stages = nn.ModuleList()
        for i, depth in enumerate(depths):
            stage = ConvNeXtStage(dims[max(i - 1, 0)], dims[i], stride=2 if i > 0 else 1, depth=depth,
                                  ls_init_value=1e-6, conv_mlp=True, norm_layer=UnbiasedLayerNorm2d)
            stage.grad_checkpointing = with_cp
            self.stages.append(stage)
        self.proj = nn.Conv2d(dims[-1], dim, 2, 2)

    def forward(self, x: Tensor) -> Tuple[Tensor, Size, List[Tensor]]:
        """(B, C_in, H, W) -> tokens (B, N, C), their grid and the ConvNeXt stage maps."""
        x = F.pad(x, (0, -x.shape[-1] % 16, 0, -x.shape[-2] % 16))
        x = self.stem(x)
        maps = []
        for stage in self.stages:
            x = stage(x)
            maps.append(x)
        x = self.proj(x)
        return x.flatten(2).transpose(1, 2).contiguous(), tuple(x.shape[-2:]), maps


# ---------------------------------------------------------------------------------------------------------
# The backbone
# ---------------------------------------------------------------------------------------------------------
@MODELS.register_module()
class FANHybrid(_TokenFAN):
    """FAN-Hybrid: FAN-ViT on a ConvNeXt stem (strides 4 and 8). Dense levels as the official detection backbone:
    the two ConvNeXt maps, FAN block ``out_block``, and a new 3x3 stride-2 conv on the patch tokens after the
    class-attention head (or, ``feat_downsample=False``, those tokens at stride 16, the segmentation layout)."""
    form = 'hybrid'

    def __init__(self, arch: Union[str, dict] = 'hybrid_s', form: Optional[str] = None, *, in_channels: int = 3,
                 mlp_ratio: float = 4., qkv_bias: bool = True, drop_rate: float = 0., attn_drop_rate: float = 0.,
                 drop_path_rate: float = 0.1, eta: float = 1., cls_attn_layers: int = 2,
                 cls_tokens_norm: bool = True, classifier: bool = False, out_indices: Sequence[int] = (0, 1, 2, 3),
                 out_norms: bool = True, out_type: str = 'featmap',
                 pos_exponent: str = 'paired', fused_attn: Optional[bool] = None, feat_downsample: bool = True,
                 norm_cfg: Optional[dict] = None, frozen_stages: int = -1, norm_eval: bool = False,
                 with_cp: bool = False, init_cfg: Optional[dict] = None):
        super().__init__(init_cfg=init_cfg)
        arch = self._setup(arch, form, in_channels, out_indices, out_norms, out_type, frozen_stages, norm_eval,
                           with_cp, fused_attn)
        self.feat_downsample = feat_downsample
        bn = partial(_build_bn, norm_cfg or dict(type='BN'))
        dim = arch['embed_dims']
        stem = HybridEmbed(in_channels, dim, arch['stem_depths'], arch['stem_dims'], with_cp)
        self._build_tokens(arch, stem, mlp_ratio=mlp_ratio, qkv_bias=qkv_bias, drop_rate=drop_rate,
                           attn_drop_rate=attn_drop_rate, drop_path_rate=drop_path_rate, eta=eta,
                           cls_attn_layers=cls_attn_layers, cls_tokens_norm=cls_tokens_norm,
                           classifier=classifier or out_type == 'cls_token',
                           class_attention=3 in self.out_indices, pos_exponent=pos_exponent, bn=bn)
        down = arch.get('down_channels', 768) if feat_downsample else dim
        if 3 in self.out_indices and feat_downsample:
            self.downsample = nn.Conv2d(dim, down, 3, 2, 1)
        self.num_features = [*arch['stem_dims'][:2], dim, down]
        self.not_in_pretrained = tuple(f'norm{i}.*' for i in range(4)) + ('downsample.*', )
        self._add_output_norms(eps=1e-6)
        self._freeze_stages()

    @property
    def strides(self) -> Tuple[int, ...]:
        return (4, 8, 16, 32 if self.feat_downsample else 16)

    def _dense_levels(self, tokens: Tensor, size: Size, maps: List[Tensor],
                      out_block_tokens: Tensor) -> Dict[int, Tensor]:
        levels = {0: maps[0], 1: maps[1], 2: tokens_to_map(out_block_tokens, size)}
        if 3 in self.out_indices:
            patches = tokens_to_map(self._class_attention(tokens)[:, 1:], size)
            levels[3] = self.downsample(patches) if self.feat_downsample else patches
        return levels

    def _init_module(self, m: nn.Module) -> None:
        # the official initialisation of the ConvNeXt stem: trunc-normal convs (the projection keeps PyTorch's)
        if isinstance(m, HybridEmbed):
            for conv in m.modules():
                if isinstance(conv, nn.Conv2d) and conv is not m.proj:
                    trunc_normal_(conv.weight, std=.02)
                    nn.init.zeros_(conv.bias)
        else:
            super()._init_module(m)

    def _stem_layer_order(self) -> LayerOrder:
        # the ConvNeXt blocks of the hybrid stem are layers too
        yield 'patch_embed.stem', False
        yield from stage_layer_order(self.patch_embed.stages, 'patch_embed.stages', before=('downsample', ))
        yield 'patch_embed.proj', False
