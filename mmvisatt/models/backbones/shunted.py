"""Shunted Transformer (Ren et al., "Shunted Self-Attention via Multi-Scale Token Aggregation", CVPR 2022).

A four-stage pyramid (strides 4/8/16/32). A convolutional stem replaces the first patch embedding; later stages
start with an overlapping 3x3 stride-2 patch embedding. In every stage with ``sr_ratio`` r > 1, half of the heads
attend to keys/values aggregated at rate r and the other half at rate r / 2
(:class:`ShuntedAttention`: head group ``g`` attends to keys and values
aggregated by a strided convolution of rate ``rates[g]``); stages with r = 1 use plain attention. The feed-forward
network adds a depthwise 3x3 conv to its hidden activations before the GELU ("detail-specific FFN"). Every stage
ends with a LayerNorm whose output is both the stage's dense feature and the next stage's input.

Odd input sizes: the stem's 2x2 stride-2 conv and the key/value aggregation convs zero-pad their input at the
bottom/right to a multiple of their stride, so nothing is dropped and stage i has ceil(H / 2**(i+2)) x
ceil(W / 2**(i+2)) positions, for any input of at least 4x4 pixels. The official code floors there instead,
dropping the border rows/columns that do not fill a window; the two agree whenever the stage-1 map is divisible
by the largest rate, e.g. for inputs padded to a multiple of 32 (mmdet's ``Pad(size_divisor=32)``) with the
official rates. The parity builder (``mmvisatt.testing.parity.shunted``) reproduces the floor for other sizes.
"""
import re
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmcv.cnn import ConvModule
from mmengine.model.weight_init import constant_init, normal_init, trunc_normal_init
from mmengine.registry import MODELS
from timm.layers import DropPath
from torch import Tensor

from mmvisatt.checkpoint import register_converter
from mmvisatt.checkpoint.renames import rename_release
from ..layers.attention import attention, resolve_fused_attn
from ..layers.checkpoint import checkpoint, checkpoint_seq
from ..layers.patch import map_to_tokens, tokens_to_map
from .base import AttentionBackbone, LayerOrder, stage_layer_order

Size = Tuple[int, int]
# eps of the block and stage LayerNorms in every official model; the stem, patch-embedding and aggregation
# LayerNorms keep PyTorch's 1e-5, as the official code does
NORM_EPS = 1e-6


def shunted_rates(sr_ratio: int) -> Tuple[int, ...]:
    """Head-group rates of a stage: (r, r / 2) for r > 1, none (plain attention) for r = 1."""
    if sr_ratio == 1:
        return ()
    if sr_ratio < 1 or sr_ratio % 2:
        raise ValueError(f'sr_ratio must be 1 or even (coarse rate r, fine rate r / 2), got {sr_ratio}')
    return sr_ratio, sr_ratio // 2


def pad_to_multiple(x: Tensor, multiple: int) -> Tensor:
    """Zero-pad an NCHW map at the bottom/right to a multiple of ``multiple`` rows and columns."""
    return F.pad(x, (0, -x.shape[-1] % multiple, 0, -x.shape[-2] % multiple))


def local_enhance(v: Tensor, conv: nn.Conv2d, size: Tuple[int, int]) -> Tensor:
    """Depthwise conv over values laid out as an image with channel = head * head_dim + d.

    v: (B, h, M, d) with M = size[0] * size[1] row-major -> (B, h, M, d).
    """
    B, h, M, d = v.shape
    image = v.transpose(-1, -2).reshape(B, h * d, *size)
    return conv(image).reshape(B, h, d, M).transpose(-1, -2)


class HeadGroupKV(nn.Module):
    """Keys and values of one head group from the map aggregated at ``rate``.

    Strided conv (kernel = stride = rate) -> LayerNorm -> GELU -> linear to K | V (each head-major), and the
    locally enhanced values V + DWConv(V). A rate of 1 is still a learned 1x1 conv, as in the official stage 3.
    """

    def __init__(self, dim: int, num_heads: int, head_dim: int, rate: int, qkv_bias: bool = False):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.rate = rate
        group_dim = num_heads * head_dim
        self.sr = nn.Conv2d(dim, dim, kernel_size=rate, stride=rate)
        # the official code hard-codes the default eps here, unlike the block norms
        self.norm = nn.LayerNorm(dim)
        self.act = nn.GELU()
        self.kv = nn.Linear(dim, 2 * group_dim, bias=qkv_bias)
        self.local_conv = nn.Conv2d(group_dim, group_dim, 3, padding=1, groups=group_dim)

    def forward(self, x: Tensor) -> Tuple[Tensor, Tensor]:
        """x: (B, C, H, W) -> k, v: (B, heads, M, head_dim), M = ceil(H / rate) * ceil(W / rate)."""
        x = self.sr(self._fit(x))
        B, _, h, w = x.shape
        tokens = self.act(self.norm(x.flatten(2).transpose(1, 2)))
        k, v = self.kv(tokens).reshape(B, h * w, 2, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        return k, v + local_enhance(v, self.local_conv, (h, w))

    def _fit(self, x: Tensor) -> Tensor:
        return pad_to_multiple(x, self.rate)


class ShuntedAttention(nn.Module):
    """Multi-head attention whose heads are shunted into groups over keys/values aggregated at ``rates``.

    Query heads are assigned to groups in order (the first ``num_heads / len(rates)`` heads to ``rates[0]``),
    and the group outputs are concatenated in that order before ``proj``. With ``rates=()`` it is plain
    multi-head attention with the values' local enhancement added after the product.

    Args:
        dim: token width C. num_heads: total heads (divisible by the number of rates).
        rates: aggregation rate of each head group, e.g. (8, 4); () for plain attention.
        qkv_bias: biases of ``q`` and the key/value projections.
        fused: ``scaled_dot_product_attention`` or the explicit softmax reference.
    """

    def __init__(self, dim: int, num_heads: int, rates: Sequence[int] = (), *, qkv_bias: bool = False,
                 attn_drop: float = 0., proj_drop: float = 0., fused: bool = True):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f'dim {dim} must be divisible by num_heads {num_heads}')
        if rates and num_heads % len(rates):
            raise ValueError(f'num_heads {num_heads} must split evenly into {len(rates)} head groups')
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim ** -0.5
        self.fused = fused
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        heads_per_group = num_heads // max(len(rates), 1)
        self.groups = nn.ModuleList(
            HeadGroupKV(dim, heads_per_group, self.head_dim, r, qkv_bias) for r in rates)
        if not rates:
            self.kv = nn.Linear(dim, 2 * dim, bias=qkv_bias)
            self.local_conv = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: Tensor, size: Tuple[int, int]) -> Tensor:
        """x: (B, N, C) tokens of an H x W map (row-major), size = (H, W) -> (B, N, C)."""
        B, N, C = x.shape
        q = self.q(x).reshape(B, N, self.num_heads, self.head_dim).transpose(1, 2)
        if len(self.groups):
            image = tokens_to_map(x, size)
            out = torch.cat([
                attention(q_g, *group(image), scale=self.scale, dropout=self._dropout(), fused=self.fused)
                for q_g, group in zip(q.chunk(len(self.groups), dim=1), self.groups)
            ], dim=1)
        else:
            k, v = self.kv(x).reshape(B, N, 2, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
            out = attention(q, k, v, scale=self.scale, dropout=self._dropout(), fused=self.fused)
            out = out + local_enhance(v, self.local_conv, size)
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(B, N, C)))

    def _dropout(self) -> float:
        return self.attn_drop.p if self.training else 0.


class DetailSpecificFFN(nn.Module):
    """fc1 -> GELU(h + DWConv3x3(h)) -> fc2 (PVTv2's FFN has no residual around the depthwise conv)."""

    def __init__(self, dim: int, hidden_dim: int, drop: float = 0.):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden_dim)
        self.dwconv = nn.Conv2d(hidden_dim, hidden_dim, 3, padding=1, groups=hidden_dim)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden_dim, dim)
        self.drop = nn.Dropout(drop)

    def forward(self, x: Tensor, size: Size) -> Tensor:
        """x: (B, N, C), size = (H, W) -> (B, N, C)."""
        x = self.fc1(x)
        local = map_to_tokens(self.dwconv(tokens_to_map(x, size)))
        x = self.drop(self.act(x + local))
        return self.drop(self.fc2(x))


class ShuntedBlock(nn.Module):
    """Pre-norm block: x + DropPath(ShuntedAttention(LN(x))), then x + DropPath(FFN(LN(x)))."""

    def __init__(self, dim: int, num_heads: int, sr_ratio: int, *, mlp_ratio: float = 4., qkv_bias: bool = True,
                 drop: float = 0., attn_drop: float = 0., drop_path: float = 0., fused_attn: bool = True):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=NORM_EPS)
        self.attn = ShuntedAttention(dim, num_heads, shunted_rates(sr_ratio), qkv_bias=qkv_bias, attn_drop=attn_drop,
                                     proj_drop=drop, fused=fused_attn)
        self.drop_path = DropPath(drop_path) if drop_path > 0. else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=NORM_EPS)
        self.mlp = DetailSpecificFFN(dim, int(dim * mlp_ratio), drop)

    def forward(self, x: Tensor, size: Size) -> Tensor:
        x = x + self.drop_path(self.attn(self.norm1(x), size))
        return x + self.drop_path(self.mlp(self.norm2(x), size))


class ShuntedStem(nn.Module):
    """Stride-4 stem: 7x7/2 conv-BN-ReLU, ``num_conv`` x 3x3 conv-BN-ReLU, 2x2/2 conv, LayerNorm (eps 1e-5)."""

    def __init__(self, in_channels: int, dim: int, num_conv: int = 0, norm_cfg: Optional[dict] = None):
        super().__init__()
        norm_cfg = norm_cfg or dict(type='BN')
        self.convs = nn.ModuleList([ConvModule(in_channels, dim, 7, 2, 3, norm_cfg=norm_cfg)])
        self.convs.extend(ConvModule(dim, dim, 3, 1, 1, norm_cfg=norm_cfg) for _ in range(num_conv))
        self.proj = nn.Conv2d(dim, dim, kernel_size=2, stride=2)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: Tensor) -> Tuple[Tensor, Size]:
        """(B, C_in, H, W) -> tokens (B, h * w, C) and (h, w), h = ceil(H / 4)."""
        for conv in self.convs:
            x = conv(x)
        x = self.proj(self._fit(x))
        size = tuple(x.shape[-2:])
        return self.norm(x.flatten(2).transpose(1, 2)), size

    def _fit(self, x: Tensor) -> Tensor:
        return pad_to_multiple(x, 2)


class OverlapPatchEmbed(nn.Module):
    """3x3 stride-2 conv (padding 1, so ceil(H / 2) rows) -> LayerNorm (eps 1e-5)."""

    def __init__(self, in_dim: int, dim: int):
        super().__init__()
        self.proj = nn.Conv2d(in_dim, dim, kernel_size=3, stride=2, padding=1)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: Tensor) -> Tuple[Tensor, Size]:
        x = self.proj(x)
        size = tuple(x.shape[-2:])
        return self.norm(x.flatten(2).transpose(1, 2)), size


class ShuntedStage(nn.Module):
    """Patch embedding (the stem in stage 0), ``depth`` shunted blocks and the stage LayerNorm."""

    def __init__(self, patch_embed: nn.Module, blocks: List[ShuntedBlock], dim: int, with_cp: bool = False):
        super().__init__()
        self.with_cp = with_cp
        self.patch_embed = patch_embed
        self.blocks = nn.ModuleList(blocks)
        self.norm = nn.LayerNorm(dim, eps=NORM_EPS)

    def forward(self, x: Tensor) -> Tensor:
        """(B, C_in, H, W) -> normalised (B, C, h, w)."""
        x, size = checkpoint(self.patch_embed, x, enabled=self.with_cp)
        x = checkpoint_seq(self.blocks, x, size, enabled=self.with_cp)
        x = self.norm(x)
        return x.transpose(1, 2).reshape(x.shape[0], -1, *size).contiguous()


@MODELS.register_module()
class ShuntedTransformer(AttentionBackbone):
    """Shunted Transformer as a multi-scale backbone (OliverRensu/Shunted-Transformer, classifier head removed).

    Args:
        arch: 't', 's', 'b' (Shunted-T/S/B, also 'shunted_t', 'tiny', ...) or a dict with ``embed_dims``,
            ``depths``, ``num_heads``, ``mlp_ratios``, ``sr_ratios`` (one entry per stage) and optionally
            ``num_conv`` (extra 3x3 stem convs, default 0). The stem width is ``embed_dims[0]`` (64 officially).
        in_channels: image channels.
        qkv_bias: query/key/value biases.
        fused_attn: ``scaled_dot_product_attention`` per head group (True) or the explicit softmax reference
            (False, the parity oracle); None takes the global default (:mod:`~mmvisatt.models.layers.attention`).
        norm_cfg: norm of the stem convs (BatchNorm; e.g. ``dict(type='SyncBN')`` for distributed training).
        drop_rate, attn_drop_rate, drop_path_rate: dropout after FFN/projection, on attention probabilities, and
            the largest stochastic-depth rate (linearly increasing over all blocks).
        out_indices: stages whose normalised outputs are returned, strides 4/8/16/32.
        frozen_stages: -1 freezes nothing, 0 the stem, k >= 1 the stem and stages 0..k-1 (with their norms).
        norm_eval: keep normalisation layers (the stem BatchNorms) in eval mode while training.
        with_cp: activation checkpointing of every block and patch embedding (the stem included; its BatchNorm
            running statistics are updated once per forward pass, as without it).
    """
    _stem = ('stages.0.patch_embed', )
    arch_zoo: Dict[str, dict] = {
        't': dict(embed_dims=(64, 128, 256, 512), depths=(1, 2, 4, 1), num_heads=(2, 4, 8, 16),
                  mlp_ratios=(8, 8, 4, 4), sr_ratios=(8, 4, 2, 1), num_conv=0),
        's': dict(embed_dims=(64, 128, 256, 512), depths=(2, 4, 12, 1), num_heads=(2, 4, 8, 16),
                  mlp_ratios=(8, 8, 4, 4), sr_ratios=(8, 4, 2, 1), num_conv=1),
        'b': dict(embed_dims=(64, 128, 256, 512), depths=(3, 4, 24, 2), num_heads=(2, 4, 8, 16),
                  mlp_ratios=(8, 8, 4, 4), sr_ratios=(8, 4, 2, 1), num_conv=2),
    }
    _arch_keys = ('embed_dims', 'depths', 'num_heads', 'mlp_ratios', 'sr_ratios')
    _per_stage_keys = ('embed_dims', 'num_heads', 'mlp_ratios', 'sr_ratios')
    _arch_prefix = 'shunted'
    # The official classifier has every tensor of this backbone (its stage norms are on the main path).
    not_in_pretrained: Tuple[str, ...] = ()

    def __init__(self, arch: Union[str, dict] = 't', *, in_channels: int = 3, qkv_bias: bool = True,
                 fused_attn: Optional[bool] = None, norm_cfg: Optional[dict] = None, drop_rate: float = 0.,
                 attn_drop_rate: float = 0., drop_path_rate: float = 0.1, out_indices: Sequence[int] = (0, 1, 2, 3),
                 frozen_stages: int = -1, norm_eval: bool = False, with_cp: bool = False,
                 init_cfg: Optional[dict] = None):
        super().__init__(init_cfg=init_cfg)
        arch = self._resolve_arch(arch)
        dims, depths = arch['embed_dims'], arch['depths']
        num_stages = len(depths)
        self._set_interface(in_channels, out_indices, num_stages, frozen_stages, norm_eval)
        self.sr_ratios = tuple(arch['sr_ratios'])
        self.num_features = list(dims)
        self.fused_attn = resolve_fused_attn(fused_attn)

        self._build_stages(depths, drop_path_rate, arch=arch, norm_cfg=norm_cfg, with_cp=with_cp,
                           block=dict(qkv_bias=qkv_bias, drop=drop_rate, attn_drop=attn_drop_rate,
                                      fused_attn=self.fused_attn))
        self._freeze_stages()

    def _make_stage(self, i: int, drop_path: List[float], *, arch: dict, norm_cfg: Optional[dict], with_cp: bool,
                    block: dict) -> nn.Module:
        dims = arch['embed_dims']
        if i == 0:
            patch_embed = ShuntedStem(self.in_channels, dims[0], arch.get('num_conv', 0), norm_cfg)
        else:
            patch_embed = OverlapPatchEmbed(dims[i - 1], dims[i])
        blocks = [ShuntedBlock(dims[i], arch['num_heads'][i], self.sr_ratios[i], mlp_ratio=arch['mlp_ratios'][i],
                               drop_path=rate, **block) for rate in drop_path]
        return ShuntedStage(patch_embed, blocks, dims[i], with_cp)

    @classmethod
    def _resolve_arch(cls, arch: Union[str, dict]) -> dict:
        arch = super()._resolve_arch(arch)
        for i, (dim, heads, sr) in enumerate(zip(arch['embed_dims'], arch['num_heads'], arch['sr_ratios'])):
            groups = len(shunted_rates(sr)) or 1
            if dim % heads or heads % groups:
                raise ValueError(f'stage {i}: embed_dims {dim} must be divisible by num_heads {heads}, and '
                                 f'num_heads by the {groups} head group(s) of sr_ratio {sr}')
        return arch

    @property
    def min_input_size(self) -> int:
        return 4

    def _default_init(self):
        # the official initialisation: trunc-normal linears, unit LayerNorms, He-normal (fan-out) convs
        for m in self.modules():
            if isinstance(m, nn.Linear):
                trunc_normal_init(m, std=.02, bias=0.)
            elif isinstance(m, nn.LayerNorm):
                constant_init(m, 1., bias=0.)
            elif isinstance(m, nn.Conv2d):
                fan_out = m.kernel_size[0] * m.kernel_size[1] * m.out_channels // m.groups
                normal_init(m, std=(2. / fan_out) ** 0.5, bias=0.)

    def forward(self, x: Tensor) -> Tuple[Tensor, ...]:
        """(B, C_in, H, W) -> tuple of (B, num_features[i], ceil(H / 2**(i+2)), ceil(W / 2**(i+2))) for
        ``out_indices``."""
        self._check_input(x)
        return self._forward_stages(x)

    def _output(self, i: int, x: Tensor) -> Tensor:
        # a stage ends with its norm, whose NCHW output is both the dense feature and the next stage's input
        return x

    def _layer_order(self) -> LayerOrder:
        # the stem is stage 0's patch embedding; a stage norm feeds the next stage, so it is not a head
        yield from stage_layer_order(self.stages, before=('patch_embed', ), after=('norm', ))


# ---------------------------------------------------------------------------------------------------------
# Checkpoints: official release files (ckpt_T/S/B.pth, SSA.py names), towhee's port, mmvisatt (mm-style) files.
# ---------------------------------------------------------------------------------------------------------
_OFFICIAL_KEY = 'patch_embed1.conv.0.weight'
_MM_KEY = 'stages.0.patch_embed.convs.0.conv.weight'


def _from_official(state_dict) -> Dict[str, Tensor]:
    """SSA.py names -> mmvisatt names (``patch_embed{s}``/``block{s}``/``norm{s}`` -> ``stages.{s-1}``)."""
    stem_indices = [int(k.split('.')[2]) for k in state_dict if k.startswith('patch_embed1.conv.')]
    last = max(stem_indices)  # the 2x2 projection closes the stem Sequential

    def backbone_key(key: str) -> str:
        m = re.match(r'patch_embed1\.conv\.(\d+)\.(.*)', key)
        if m:
            index, rest = int(m.group(1)), m.group(2)
            # Sequential: conv, BN, ReLU per stem layer, then the projection
            part = 'proj' if index == last else f'convs.{index // 3}.' + ('conv' if index % 3 == 0 else 'bn')
            return f'stages.0.patch_embed.{part}.{rest}'
        key = re.sub(r'^(patch_embed|norm)(\d+)\.', lambda g: f'stages.{int(g.group(2)) - 1}.{g.group(1)}.', key)
        key = re.sub(r'^block(\d+)\.', lambda g: f'stages.{int(g.group(1)) - 1}.blocks.', key)
        key = re.sub(r'\.attn\.(sr|norm|kv|local_conv)(\d)\.', lambda g: f'.attn.groups.{int(g.group(2)) - 1}.'
                     f'{g.group(1)}.', key)
        return key.replace('.mlp.dwconv.dwconv.', '.mlp.dwconv.')

    return rename_release(state_dict, backbone_key)


@register_converter('shunted', is_mm=lambda keys: _MM_KEY in keys)
def convert_shunted_checkpoint(state_dict: Dict[str, Tensor],
                               prefixed: bool) -> Optional[Tuple[Dict[str, Tensor], str]]:
    """Official Shunted (``ckpt_{T,S,B}.pth``) or towhee keys -> mm-style ShuntedTransformer keys.

    The classifier ``head.*`` becomes ``head.fc.*``. Inside ``backbone.`` (a detector trained with the official
    backbone class) the official names are mapped the same way.
    """
    keys = set(state_dict)
    if _OFFICIAL_KEY not in keys:
        return None
    if prefixed:
        return _from_official(state_dict), 'official-shunted'
    towhee = not any('.mlp.dwconv.dwconv.' in k for k in keys)
    return _from_official(state_dict), 'towhee-shunted' if towhee else 'official-shunted'
