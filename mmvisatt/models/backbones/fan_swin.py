"""FAN-Swin: Swin stages whose MLPs are FAN's efficient channel attention (Zhou et al., ICML 2022; the shared
parts are in :mod:`~mmvisatt.models.backbones.fan`). Stages 1-3 use the channel attention, the last a plain MLP."""
from functools import partial
from typing import Callable, List, Optional, Sequence, Tuple, Union

import torch.nn as nn
from mmengine.registry import MODELS
from timm.layers import DropPath, Mlp
from torch import Tensor

from ..layers.patch import PatchEmbed
from ..layers.swin_stage import SwinStage
from ..layers.window import WindowAttention, WindowGrid, merge_windows, partition_windows, window_attention_mask
from .base import LayerOrder, stage_layer_order
from .fan import EfficientChannelAttention, FANBase, _build_bn


# ---------------------------------------------------------------------------------------------------------
# Block
# ---------------------------------------------------------------------------------------------------------
class FANSwinBlock(nn.Module):
    """A Swin block (W-MSA / SW-MSA) whose MLP is FAN's channel attention (computed over the whole map, not per
    window; its value MLP has no identity around the depthwise convs) or, with ``channel_attn=False``, a plain
    MLP."""

    def __init__(self, dim: int, num_heads: int, *, window_size: int = 7, shifted: bool = False,
                 mlp_ratio: float = 4., qkv_bias: bool = True, drop: float = 0., attn_drop: float = 0.,
                 drop_path: float = 0., channel_attn: bool = True, fused: bool = True,
                 norm_layer: Callable[[int], nn.Module] = nn.BatchNorm2d):
        super().__init__()
        self.window_size = window_size
        self.shift = window_size // 2 if shifted else 0
        self.norm1 = nn.LayerNorm(dim)
        self.attn = WindowAttention(dim, num_heads, window_size, qkv_bias=qkv_bias, attn_drop=attn_drop,
                                    proj_drop=drop, fused=fused)
        self.norm2 = nn.LayerNorm(dim)
        hidden = int(dim * mlp_ratio)
        if channel_attn:
            self.channel_attn = EfficientChannelAttention(dim, num_heads, hidden, qkv_bias=qkv_bias,
                                                          attn_drop=attn_drop, drop=drop, value_residual=False,
                                                          norm_layer=norm_layer)
        else:
            self.mlp = Mlp(dim, hidden, act_layer=nn.GELU, drop=drop)
        self.drop_path = DropPath(drop_path) if drop_path > 0. else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        """(B, H, W, C) -> (B, H, W, C)."""
        B, H, W, C = x.shape
        grid = WindowGrid.build(H, W, self.window_size, self.shift)
        mask = window_attention_mask(grid, x.device)
        windows = self.attn(partition_windows(self.norm1(x), grid), grid.num_windows, mask)
        x = x + self.drop_path(merge_windows(windows, grid))
        tokens = self.norm2(x).reshape(B, H * W, C)
        if hasattr(self, 'channel_attn'):
            out = self.channel_attn(tokens, (H, W))
        else:
            out = self.mlp(tokens)
        return x + self.drop_path(out.reshape(B, H, W, C))


# ---------------------------------------------------------------------------------------------------------
# The backbone
# ---------------------------------------------------------------------------------------------------------
@MODELS.register_module()
class FANSwin(FANBase):
    """FAN-Swin: Swin-T/S/B/L stages whose MLPs are FAN's channel attention (``channel_attn`` per stage)."""
    form = 'swin'
    static_export_reason = ('the window padding and shift mask are built from the map size in Python, so '
                            'torch.export fixes the size')

    def __init__(self, arch: Union[str, dict] = 'swin_t', form: Optional[str] = None, *, in_channels: int = 3,
                 mlp_ratio: float = 4., qkv_bias: bool = True, drop_rate: float = 0., attn_drop_rate: float = 0.,
                 drop_path_rate: float = 0.1, out_indices: Sequence[int] = (0, 1, 2, 3), out_norms: bool = True,
                 out_type: str = 'featmap', window_size: int = 7, patch_size: int = 4,
                 fused_attn: Optional[bool] = None, norm_cfg: Optional[dict] = None, frozen_stages: int = -1,
                 norm_eval: bool = False, with_cp: bool = False, init_cfg: Optional[dict] = None):
        super().__init__(init_cfg=init_cfg)
        arch = self._setup(arch, form, in_channels, out_indices, out_norms, out_type, frozen_stages, norm_eval,
                           with_cp, fused_attn)
        depths, heads = arch['depths'], arch['num_heads']
        if len(depths) != 4 or len(heads) != 4:
            raise ValueError(f'FAN-Swin needs four stages, got depths {depths} and num_heads {heads}')
        bn = partial(_build_bn, norm_cfg or dict(type='BN'))
        channel_attn = arch.get('channel_attn', (True, True, True, False))
        self.patch_size = patch_size
        self.num_features = [arch['embed_dims'] * 2 ** i for i in range(4)]
        self.patch_embed = PatchEmbed(in_channels, arch['embed_dims'], patch_size)
        self.pos_drop = nn.Dropout(drop_rate)
        self._build_stages(depths, drop_path_rate, heads=heads, channel_attn=channel_attn, with_cp=with_cp,
                           block=dict(window_size=window_size, mlp_ratio=mlp_ratio, qkv_bias=qkv_bias,
                                      drop=drop_rate, attn_drop=attn_drop_rate, fused=self.fused_attn,
                                      norm_layer=bn))
        self.not_in_pretrained = tuple(f'norm{i}.*' for i in range(3))
        self._add_output_norms(eps=1e-5)
        self._freeze_stages()

    def _make_stage(self, i: int, drop_path: List[float], *, heads: Sequence[int], channel_attn: Sequence[bool],
                    with_cp: bool, block: dict) -> nn.Module:
        dims = self.num_features
        return SwinStage(dims[max(i - 1, 0)], dims[i], len(drop_path), downsample=i > 0, drop_path=drop_path,
                         make_block=partial(FANSwinBlock, dims[i], heads[i], channel_attn=bool(channel_attn[i]),
                                            **block), with_cp=with_cp)

    def _forward_dense(self, x: Tensor) -> Tuple[Tensor, ...]:
        return self._forward_stages(self.pos_drop(self.patch_embed(x)))

    def forward_classifier(self, x: Tensor) -> Tensor:
        """(B, C_in, H, W) -> (B, C): the mean of the normalised last stage (needs ``norm3``:
        ``out_type='avg_featmap'``, or ``3 in out_indices`` and ``out_norms``)."""
        self._check_input(x)
        if not (3 in self.out_indices and self.out_norms):
            raise RuntimeError("forward_classifier of a swin FAN needs norm3 (out_type='avg_featmap', or 3 in "
                               "out_indices with out_norms=True)")
        return self._forward_dense(x)[self.out_indices.index(3)].mean(dim=(2, 3))

    def _layer_order(self) -> LayerOrder:
        yield 'patch_embed', False
        yield from stage_layer_order(self.stages, before=('downsample', ))
