"""FAN-ViT: FAN blocks on a 4-conv stride-16 stem with Fourier position encoding (Zhou et al., ICML 2022; the shared
parts are in :mod:`~mmvisatt.models.backbones.fan`). A plain, single-scale ViT: dense tasks get ViTDet's simple
feature pyramid on the last block."""
from functools import partial
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch.nn as nn
from mmengine.registry import MODELS
from torch import Tensor

from ..layers.patch import tokens_to_map
from ..layers.simple_pyramid import PYRAMID_WIDTHS, SimpleFeaturePyramid
from .fan import Size, _build_bn, _TokenFAN


# ---------------------------------------------------------------------------------------------------------
# Stem
# ---------------------------------------------------------------------------------------------------------
class ConvPatchEmbed(nn.Module):
    """FAN-ViT's stem: four 3x3 stride-2 convs (no bias) each with a BatchNorm, GELU between, widths
    C/8, C/4, C/2, C. Gives ceil(H / 16) x ceil(W / 16) tokens for any input."""

    def __init__(self, in_channels: int, dim: int, norm_layer: Callable[[int], nn.Module]):
        super().__init__()
        widths = [in_channels, dim // 8, dim // 4, dim // 2, dim]
        layers: List[nn.Module] = []
        for i in range(4):
            layers.append(nn.Sequential(nn.Conv2d(widths[i], widths[i + 1], 3, 2, 1, bias=False),
                                        norm_layer(widths[i + 1])))
            if i < 3:
                layers.append(nn.GELU())
        self.proj = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tuple[Tensor, Size, List[Tensor]]:
        """(B, C_in, H, W) -> tokens (B, N, C), their grid (H', W') and no intermediate maps."""
        x = self.proj(x)
        # contiguous tokens: a transposed view would make the residual stream of every block strided
        return x.flatten(2).transpose(1, 2).contiguous(), tuple(x.shape[-2:]), []


# ---------------------------------------------------------------------------------------------------------
# The backbone
# ---------------------------------------------------------------------------------------------------------
@MODELS.register_module()
class FANViT(_TokenFAN):
    """FAN-ViT: a stride-16 conv stem, FAN blocks (token attention + efficient channel attention) and, for
    classification, the class-attention head; dense levels from a simple feature pyramid on the last block."""
    form = 'vit'

    def __init__(self, arch: Union[str, dict] = 'vit_s', form: Optional[str] = None, *, in_channels: int = 3,
                 mlp_ratio: float = 4., qkv_bias: bool = True, drop_rate: float = 0., attn_drop_rate: float = 0.,
                 drop_path_rate: float = 0.1, eta: float = 1., cls_attn_layers: int = 2,
                 cls_tokens_norm: bool = True, classifier: bool = False, out_indices: Sequence[int] = (0, 1, 2, 3),
                 out_norms: bool = True, out_type: str = 'featmap', pos_exponent: str = 'paired',
                 fused_attn: Optional[bool] = None, norm_cfg: Optional[dict] = None, frozen_stages: int = -1,
                 norm_eval: bool = False, with_cp: bool = False, init_cfg: Optional[dict] = None):
        super().__init__(init_cfg=init_cfg)
        arch = self._setup(arch, form, in_channels, out_indices, out_norms, out_type, frozen_stages, norm_eval,
                           with_cp, fused_attn)
        bn = partial(_build_bn, norm_cfg or dict(type='BN'))
        dim = arch['embed_dims']
        self._build_tokens(arch, ConvPatchEmbed(in_channels, dim, bn), mlp_ratio=mlp_ratio, qkv_bias=qkv_bias,
                           drop_rate=drop_rate, attn_drop_rate=attn_drop_rate, drop_path_rate=drop_path_rate,
                           eta=eta, cls_attn_layers=cls_attn_layers, cls_tokens_norm=cls_tokens_norm,
                           classifier=classifier or out_type == 'cls_token', class_attention=False,
                           pos_exponent=pos_exponent, bn=bn)
        if self.out_indices:
            self.pyramid = SimpleFeaturePyramid(dim, self.out_indices)
        self.num_features = [int(dim * w) for w in PYRAMID_WIDTHS]
        self.not_in_pretrained = tuple(f'norm{i}.*' for i in range(4)) + ('pyramid.*', )
        self._add_output_norms(eps=1e-6)
        self._freeze_stages()

    def _dense_levels(self, tokens: Tensor, size: Size, maps: List[Tensor],
                      out_block_tokens: Tensor) -> Dict[int, Tensor]:
        return self.pyramid(tokens_to_map(tokens, size))
