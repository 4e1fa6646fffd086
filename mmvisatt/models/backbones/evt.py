"""EVT: Advancing Vision Transformer with Enhanced Spatial Priors (Fan et al., arXiv 2604.18549).

As the paper describes it (section numbers of the paper; ``docs/evt.md`` lists each statement against the code):

- an EVT block is CPE (a 3x3 depthwise conv), Euclidean self-attention (EuSA) and the classic FFN (§3.2), with
  RMT's conv stem and conv downsampling (§4.6 names the stem and CPE as what EVT-Swin leaves out);
- EuSA biases each head's logits by ``sqrt(dy^2 + dx^2) * log gamma_h``, a different decay per head (§3.3, §4.6),
  within 1-D, spatially independent groups of the raster-ordered tokens: consecutive (EuSAg) or interleaved
  (EuSAd), with the 2-D distance between the tokens' true positions (§3.4);
- EVT-T/S/B/L follow RMT (§3.5): EVT-T deeper than RMT-T (§4.6), EVT-L about 100M parameters (§1), stochastic
  depth 0.1 / 0.15 / 0.4 / 0.55 (§4.1); EVT-Swin-T/S/B are Swin-T/S/B with (S)W-MSA replaced by EuSAg / EuSAd and
  Swin's global attention by EuSA, without CPE or conv stem (§3.5, §4.6).

What the lost tables leave open (depths, which stages group, the gamma formula, group size) is ours, chosen by the
rules the text gives and kept as preset values; ``docs/evt.md`` says why.
"""
from typing import Dict, List, Optional, Sequence, Set, Tuple, Union

import torch
import torch.nn as nn
from mmengine.registry import MODELS
from timm.layers import DropPath, Mlp
from torch import Tensor

from mmvisatt.checkpoint import register_family
from ..layers.attention import attention
from ..layers.checkpoint import checkpoint
from ..layers.helpers import check_choice
from ..layers.patch import PatchEmbed, PatchMerging
from ..layers.spatial_decay import (ConvDownsample, ConvStem, RetentiveBlock, SpatialDecay, TokenGroups, group_tokens,
                                    ungroup_tokens)
from .base import DecayBackbone

MODES = ('grouped', 'dilated', 'full')
STYLES = ('rmt', 'swin')


class EuclideanSelfAttention(nn.Module):
    """EuSA: multi-head attention with a Euclidean spatial decay, within token groups or over the whole map.

    Args:
        dim: channels.
        num_heads: heads (each with its own decay).
        mode: ``'grouped'`` (EuSAg), ``'dilated'`` (EuSAd) or ``'full'``.
        fused: ``scaled_dot_product_attention`` or the explicit softmax reference.
    """

    def __init__(self, dim: int, num_heads: int, mode: str = 'grouped', fused: bool = True):
        super().__init__()
        check_choice('EuSA mode', mode, MODES)
        self.num_heads = num_heads
        self.scale = (dim // num_heads) ** -0.5
        self.mode = mode
        self.fused = fused
        self.q_proj = nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, dim)
        self.v_proj = nn.Linear(dim, dim)
        self.out_proj = nn.Linear(dim, dim)

    def forward(self, x: Tensor, bias: Tensor, groups: Optional[TokenGroups] = None) -> Tensor:
        """x: (B, H, W, C); bias: (heads, HW, HW) for full attention, else (heads, G, g, g) with ``groups``."""
        B, H, W, C = x.shape
        q, k, v = self.q_proj(x), self.k_proj(x) * self.scale, self.v_proj(x)
        heads = self.num_heads
        if groups is None:
            q, k, v = (t.reshape(B, H * W, heads, -1).transpose(1, 2) for t in (q, k, v))
            out = attention(q, k, v, bias, 1., fused=self.fused).transpose(1, 2)
        else:
            # (B, G, g, heads, d) -> (B, heads * G, g, d): each (head, group) pair is one attention problem
            q, k, v = (group_tokens(t.reshape(B, H * W, C), groups).unflatten(-1, (heads, -1))
                       .permute(0, 3, 1, 2, 4).flatten(1, 2) for t in (q, k, v))
            out = attention(q, k, v, bias.flatten(0, 1), 1., fused=self.fused)
            out = ungroup_tokens(out.unflatten(1, (heads, -1)).permute(0, 2, 3, 1, 4).flatten(-2), groups)
        return self.out_proj(out.reshape(B, H, W, C))


class SwinEuSABlock(nn.Module):
    """A Swin block (LN -> attention -> LN -> MLP, post-residual) with EuSA in place of (S)W-MSA."""

    def __init__(self, dim: int, attn: nn.Module, mlp_ratio: float = 4., drop_path: float = 0.):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = attn
        self.drop_path = DropPath(drop_path) if drop_path > 0. else nn.Identity()
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=nn.GELU)

    def forward(self, x: Tensor, *context) -> Tensor:
        x = x + self.drop_path(self.attn(self.norm1(x), *context))
        return x + self.drop_path(self.mlp(self.norm2(x)))


class EVTStage(nn.Module):
    """``depth`` blocks alternating EuSAg / EuSAd (or all full attention), sharing the stage's decay rates, then
    the optional downsampling. Returns the stage output and the downsampled map.

    ``style='rmt'``: CPE + EuSA + classic FFN blocks and a strided-conv downsampling (EVT-T/S/B/L);
    ``style='swin'``: Swin's blocks and patch merging (EVT-Swin)."""

    def __init__(self, dim: int, out_dim: Optional[int], depth: int, num_heads: int, *, mlp_ratio: float,
                 init_value: float, heads_range: float, full: bool, group_size: int, drop_path: Sequence[float],
                 layer_scale: Optional[float] = None, style: str = 'rmt', with_cp: bool = False,
                 fused: bool = True, norm_cfg: Optional[dict] = None):
        super().__init__()
        self.with_cp = with_cp
        self.group_size = group_size
        self.decay = SpatialDecay(num_heads, init_value, heads_range)
        self.modes = ['full' if full else ('grouped', 'dilated')[i % 2] for i in range(depth)]
        self.blocks = nn.ModuleList()
        for mode, rate in zip(self.modes, drop_path):
            attn = EuclideanSelfAttention(dim, num_heads, mode, fused=fused)
            if style == 'rmt':
                self.blocks.append(RetentiveBlock(dim, attn, mlp_ratio, rate, layer_scale, conv_ffn=False))
            else:
                self.blocks.append(SwinEuSABlock(dim, attn, mlp_ratio, rate))
        if not out_dim:
            self.downsample = None
        else:
            self.downsample = (ConvDownsample(dim, out_dim, norm_cfg) if style == 'rmt' else
                               PatchMerging(dim, out_dim))

    def context(self, height: int, width: int, dtype: torch.dtype) -> Dict[str, tuple]:
        """Per mode, what its blocks take besides x: the bias (and the grouping)."""
        context = {}
        for mode in set(self.modes):
            if mode == 'full':
                context[mode] = (self.decay.grid(height, width, 'euclidean', dtype), )
            else:
                groups, bias = self.decay.groups(height, width, self.group_size, mode, dtype)
                context[mode] = (bias, groups)
        return context

    def forward(self, x: Tensor) -> Tuple[Tensor, Tensor]:
        context = self.context(x.shape[1], x.shape[2], x.dtype)
        for mode, block in zip(self.modes, self.blocks):
            x = checkpoint(block, x, *context[mode], enabled=self.with_cp)
        return x, (x if self.downsample is None else self.downsample(x))


def _preset(dims: Tuple[int, ...], depths: Tuple[int, ...], heads: Tuple[int, ...], mlp_ratios: Tuple[int, ...],
            heads_ranges: Tuple[int, ...], drop_path_rate: float, style: str = 'rmt') -> dict:
    return dict(embed_dims=dims, depths=depths, num_heads=heads, mlp_ratios=mlp_ratios, heads_ranges=heads_ranges,
                drop_path_rate=drop_path_rate, **({'style': style} if style != 'rmt' else {}))


@MODELS.register_module()
class EVT(DecayBackbone):
    """EVT as a multi-scale backbone (strides 4/8/16/32, NCHW, one LayerNorm per output).

    Args:
        arch: ``'t'``, ``'s'``, ``'b'``, ``'l'`` (also ``'evt_t'`` ...), ``'swin_t'``, ``'swin_s'``, ``'swin_b'``
            (also ``'evt_swin_t'`` ...: Swin-T/S/B with EuSA) or a dict with ``embed_dims``, ``depths``,
            ``num_heads`` and optionally ``mlp_ratios``, ``init_values``, ``heads_ranges``, ``full_attention`` and
            ``layer_scales`` (per stage), ``style`` (``'rmt'`` or ``'swin'``) and ``drop_path_rate``.
        group_size: tokens per EuSAg / EuSAd group (49 = a 7x7 window's worth).
        drop_path_rate: None takes the preset's value (the paper's 0.1 / 0.15 / 0.4 / 0.55 for T / S / B / L;
            Swin's 0.2 / 0.3 / 0.5 for EVT-Swin-T / S / B).
        layer_init_values: initial layer-scale value where an arch dict asks for layer scale (no preset does).
        fused_attn, out_norms, in_channels, out_indices, frozen_stages, norm_eval, with_cp, norm_cfg, init_cfg:
            as :class:`~mmvisatt.models.backbones.rmt.RMT` (``norm_cfg`` is unused by the Swin style, which has no
            BatchNorm).
    """
    # Our reading of the lost Table 5 (docs/evt.md): RMT's widths, heads, MLP ratios and decay ranges; EVT-T
    # deeper than RMT-T and EVT-L deepened to the paper's parameter count, both in stage 3 where RMT adds depth.
    arch_zoo: Dict[str, dict] = {
        't': _preset((64, 128, 256, 512), (2, 2, 10, 2), (4, 4, 8, 16), (3, 3, 3, 3), (4, 4, 6, 6), 0.1),
        's': _preset((64, 128, 256, 512), (3, 4, 18, 4), (4, 4, 8, 16), (4, 4, 3, 3), (4, 4, 6, 6), 0.15),
        'b': _preset((80, 160, 320, 512), (4, 8, 25, 8), (5, 5, 10, 16), (4, 4, 3, 3), (5, 5, 6, 6), 0.4),
        'l': _preset((112, 224, 448, 640), (4, 8, 28, 8), (7, 7, 14, 20), (4, 4, 3, 3), (6, 6, 6, 6), 0.55),
        # Swin-T/S/B exactly (C, depths, heads, MLP ratio 4, drop path)
        'swin_t': _preset((96, 192, 384, 768), (2, 2, 6, 2), (3, 6, 12, 24), (4, 4, 4, 4), (4, 4, 6, 6), 0.2, 'swin'),
        'swin_s': _preset((96, 192, 384, 768), (2, 2, 18, 2), (3, 6, 12, 24), (4, 4, 4, 4), (4, 4, 6, 6), 0.3, 'swin'),
        'swin_b': _preset((128, 256, 512, 1024), (2, 2, 18, 2), (4, 8, 16, 32), (4, 4, 4, 4), (4, 4, 6, 6), 0.5,
                          'swin'),
    }
    _per_stage_keys = DecayBackbone._per_stage_keys + ('full_attention', )
    _arch_prefix = 'evt'
    static_export_reason = ('the token groups (their number and padding) are Python integers of the map '
                            'size, which torch.export cannot trace symbolically')

    def __init__(self, arch: Union[str, dict] = 't', *, in_channels: int = 3, group_size: int = 49,
                 drop_path_rate: Optional[float] = None, layer_init_values: float = 1e-6,
                 fused_attn: Optional[bool] = None, out_norms: bool = True, out_indices: Optional[Sequence[int]] = None,
                 frozen_stages: int = -1, norm_eval: bool = False, with_cp: bool = False,
                 norm_cfg: Optional[dict] = None, init_cfg: Optional[dict] = None):
        super().__init__(init_cfg=init_cfg)
        arch = self._resolve_arch(arch)
        if group_size < 1:
            raise ValueError(f'group_size must be positive, got {group_size}')
        self.style = check_choice('EVT style', arch['style'], STYLES)
        self.group_size = group_size
        self._build(arch, in_channels=in_channels, drop_path_rate=drop_path_rate,
                    layer_init_values=layer_init_values, fused_attn=fused_attn, out_norms=out_norms,
                    out_indices=out_indices, frozen_stages=frozen_stages, norm_eval=norm_eval, with_cp=with_cp,
                    norm_cfg=norm_cfg)

    def _make_stem(self, in_channels: int, dim: int, norm_cfg: Optional[dict]) -> nn.Module:
        # EVT-Swin has Swin's patch embedding, not RMT's conv stem (paper section 4.6)
        return ConvStem(in_channels, dim, norm_cfg) if self.style == 'rmt' else PatchEmbed(in_channels, dim, 4)

    def _make_stage(self, i: int, drop_path: List[float], *, arch: dict, layer_init_values: float, with_cp: bool,
                    norm_cfg: Optional[dict]) -> nn.Module:
        dims = arch['embed_dims']
        return EVTStage(dims[i], dims[i + 1] if i < len(dims) - 1 else None, arch['depths'][i], arch['num_heads'][i],
                        mlp_ratio=arch['mlp_ratios'][i], init_value=arch['init_values'][i],
                        heads_range=arch['heads_ranges'][i], full=arch['full_attention'][i],
                        group_size=self.group_size, drop_path=drop_path,
                        layer_scale=layer_init_values if arch['layer_scales'][i] else None, style=self.style,
                        with_cp=with_cp, fused=self.fused_attn, norm_cfg=norm_cfg)

    @classmethod
    def _stage_defaults(cls, num_stages: int) -> dict:
        return {**super()._stage_defaults(num_stages), 'style': 'rmt',
                'full_attention': tuple(i == num_stages - 1 for i in range(num_stages))}


def _evt_is_mm(keys: Set[str]) -> bool:
    # RMT files are not EVT files: they carry a rotary phase EVT does not have
    return 'stages.0.decay.log_gamma' in keys and 'stages.0.rotary.angle' not in keys


# there is no EVT release outside mmvisatt: its files are mmvisatt's own layout, with no key map
register_family('evt', is_mm=_evt_is_mm)
