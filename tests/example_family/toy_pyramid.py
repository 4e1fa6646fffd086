"""ToyPyramid: the smallest backbone family written the way ``docs/contributing.md`` describes (and the test that
reads it checks): global multi-head attention in a four-stage pyramid with Swin's patch merging.

One file, in timm's order: attention, block, stage, the model with its presets. The staged base
(:class:`~mmvisatt.models.backbones.base.AttentionBackbone`) gives the mm interface: presets, ``out_indices``,
output norms, the stage loop, ``frozen_stages`` / ``norm_eval``, layer ids for layer-wise decay, pretrained
loading. A family with released weights also registers a checkpoint converter (see ``reswin.py``).
"""
from functools import partial
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch.nn as nn
from mmengine.registry import MODELS
from timm.layers import DropPath, Mlp
from torch import Tensor

from mmvisatt.models.backbones.base import AttentionBackbone, LayerOrder, stage_layer_order
from mmvisatt.models.layers.attention import attention, resolve_fused_attn
from mmvisatt.models.layers.checkpoint import checkpoint_seq
from mmvisatt.models.layers.patch import PatchEmbed, PatchMerging


class GlobalAttention(nn.Module):
    """Multi-head self-attention over the whole (H, W) map; ``fused`` picks the path of
    :func:`~mmvisatt.models.layers.attention.attention` (``scaled_dot_product_attention`` or the explicit one)."""

    def __init__(self, dim: int, num_heads: int, fused: bool = True):
        super().__init__()
        self.num_heads = num_heads
        self.fused = fused
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        """(B, H, W, C) -> (B, H, W, C)."""
        B, H, W, C = x.shape
        q, k, v = self.qkv(x).reshape(B, H * W, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        out = attention(q, k, v, fused=self.fused)
        return self.proj(out.transpose(1, 2).reshape(B, H, W, C))


class ToyBlock(nn.Module):
    """Pre-norm transformer block on channels-last maps."""

    def __init__(self, dim: int, num_heads: int, *, drop_path: float = 0., fused: bool = True):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = GlobalAttention(dim, num_heads, fused)
        self.drop_path = DropPath(drop_path) if drop_path > 0. else nn.Identity()
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, 2 * dim)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.drop_path(self.attn(self.norm1(x)))
        return x + self.drop_path(self.mlp(self.norm2(x)))


class ToyStage(nn.Module):
    """Patch merging (after the first stage), then the blocks."""

    def __init__(self, in_dim: int, dim: int, blocks: List[nn.Module], with_cp: bool = False):
        super().__init__()
        self.with_cp = with_cp
        self.downsample = PatchMerging(in_dim, dim) if in_dim != dim else None
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x: Tensor) -> Tensor:
        if self.downsample is not None:
            x = self.downsample(x)
        return checkpoint_seq(self.blocks, x, enabled=self.with_cp)


@MODELS.register_module()
class ToyPyramid(AttentionBackbone):
    """A four-stage pyramid (strides 4/8/16/32) of global-attention blocks.

    Args:
        arch: ``'t'`` (also ``'toy_t'``, ``'tiny'``) or a dict with ``embed_dims``, ``depths`` and ``num_heads``
            (one entry per stage).
        drop_path_rate: stochastic depth of the last block, rising linearly from 0.
        fused_attn: ``scaled_dot_product_attention`` (True) or the explicit reference (False); None: timm's
            global setting.
        in_channels, out_indices, frozen_stages, norm_eval, with_cp, init_cfg: as every mmvisatt backbone.
    """
    arch_zoo: Dict[str, dict] = {'t': dict(embed_dims=(16, 32, 64, 128), depths=(1, 1, 2, 1), num_heads=(1, 2, 4, 8))}
    _arch_keys = ('embed_dims', 'depths', 'num_heads')
    _per_stage_keys = ('embed_dims', 'num_heads')
    _arch_prefix = 'toy'
    # the dense outputs' norms: an ImageNet checkpoint has none of them
    not_in_pretrained = tuple(f'norm{i}.*' for i in range(4))

    def __init__(self, arch: Union[str, dict] = 't', *, in_channels: int = 3, drop_path_rate: float = 0.1,
                 fused_attn: Optional[bool] = None, out_indices: Sequence[int] = (0, 1, 2, 3),
                 frozen_stages: int = -1, norm_eval: bool = False, with_cp: bool = False,
                 init_cfg: Optional[dict] = None):
        super().__init__(init_cfg=init_cfg)
        arch = self._resolve_arch(arch)
        self._set_interface(in_channels, out_indices, len(arch['depths']), frozen_stages, norm_eval)
        self.patch_size = 4
        self.num_features = list(arch['embed_dims'])
        self.fused_attn = resolve_fused_attn(fused_attn)
        self.patch_embed = PatchEmbed(in_channels, self.num_features[0], self.patch_size)
        self._build_stages(arch['depths'], drop_path_rate, heads=arch['num_heads'], with_cp=with_cp)
        self._add_output_norms()
        self._freeze_stages()

    def _make_stage(self, i: int, drop_path: List[float], *, heads: Sequence[int], with_cp: bool) -> nn.Module:
        dims = self.num_features
        block = partial(ToyBlock, dims[i], heads[i], fused=self.fused_attn)
        return ToyStage(dims[max(i - 1, 0)], dims[i], [block(drop_path=rate) for rate in drop_path], with_cp)

    def forward(self, x: Tensor) -> Tuple[Tensor, ...]:
        """(B, C_in, H, W) -> tuple of (B, num_features[i], ceil(H / 2**(i+2)), ceil(W / 2**(i+2)))."""
        self._check_input(x)
        return self._forward_stages(self.patch_embed(x))

    def _layer_order(self) -> LayerOrder:
        yield 'patch_embed', False
        yield from stage_layer_order(self.stages, before=('downsample', ))
