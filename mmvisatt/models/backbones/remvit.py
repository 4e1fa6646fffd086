"""ReMViTv2: MViTv2 with attention residual connections (Diko et al., arXiv 2402.11301).

Every block pools its queries and keys/values (MViTv2) and mixes its pre-softmax scores with the previous block's,
brought onto its own query and key grids first. The block and its attention are shared with
ReViT (:mod:`mmvisatt.models.layers.pooling_attention`). Stage, backbone, then the checkpoint converter.
"""
import re
from typing import Dict, Optional, Sequence, Set, Tuple, Union

import torch.nn as nn
from mmengine.registry import MODELS
from timm.layers import trunc_normal_
from torch import Tensor

from mmvisatt.checkpoint import register_converter
from mmvisatt.checkpoint.renames import final_norm_key, rename_release
from ..layers.attention import resolve_fused_attn
from ..layers.checkpoint import checkpoint
from ..layers.patch import PatchEmbed
from ..layers.pooling_attention import PoolingResidualAttention, ResidualAttentionBlock
from ..layers.residual_attention import PooledScores, make_alpha
from ..layers.score_memory import check_score_memory
from .base import AttentionBackbone, LayerOrder, drop_path_rates, init_transformer_weights, stage_layer_order
from .revit import _has_pooling


class ReMViTStage(nn.Module):
    """A run of blocks at one resolution; the first block strides the queries and widens the channels."""

    def __init__(self, blocks: Sequence[ResidualAttentionBlock], with_cp: bool = False):
        super().__init__()
        self.with_cp = with_cp
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x: Tensor, residual: Optional[PooledScores],
                alpha: Union[Tensor, float]) -> Tuple[Tensor, PooledScores]:
        """(B, H, W, C_in) -> (B, H', W', C), plus the last block's scores."""
        for block in self.blocks:
            x, residual = checkpoint(block, x, residual, alpha, enabled=self.with_cp)
        return x, residual


def _per_stage(value: Union[int, Sequence[int]], num_stages: int) -> Tuple[int, ...]:
    """An int is the first stage's value, doubled at every stage (MViTv2's rule); a sequence gives each stage's
    (its length checked with the preset)."""
    if isinstance(value, int):
        return tuple(value * 2 ** i for i in range(num_stages))
    return tuple(value)


def _pair(value: Union[int, Sequence[int]]) -> Tuple[int, int]:
    return (value, value) if isinstance(value, int) else tuple(value)


def _init_position_tables(m: nn.Module) -> None:
    if isinstance(m, PoolingResidualAttention) and m.rel_pos_h is not None:
        trunc_normal_(m.rel_pos_h, std=.02)
        trunc_normal_(m.rel_pos_w, std=.02)


@MODELS.register_module()
class ReMViTv2(AttentionBackbone):
    """ReMViTv2: MViTv2 with residual attention scores, as a multi-scale backbone (outputs at strides 4/8/16/32).

    Every block pools its queries (at stride 2 in the first block of stages 2-4, else 1) and its keys/values
    (at the adaptive stride) with depthwise convolutions; the residual scores are brought onto each block's
    query and key grids by image position before the mix (``docs/residual_attention.md``). The outputs are
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
        learnable_alpha: the residual gate (0.5 at first) learns; False keeps it the constant 0.5.
        score_memory: how the blocks keep their score maps (:mod:`~mmvisatt.models.layers.score_memory`):
            ``'full'`` (default), the reference; ``'handoff'``, row chunks recomputed in the backward, and blocks
            whose scores the next block shrinks (pools their queries or keys, or averages their heads) hand them
            on shrunk, so only the carried maps are kept. The dense and ImageNet configs set ``'handoff'``: their
            training peaks (docs/benchmarks.md, Memory per GPU) are over 80 GB without it. Values equal the
            reference's up to rounding.
        fused_attn: ``scaled_dot_product_attention`` with the carried scores as its bias (True), or the explicit
            softmax (False, the reference the parity fixtures check); None takes timm's global setting.
        out_indices, frozen_stages, norm_eval, with_cp, drop_path_rate, init_cfg: as in ReSwinTransformer.
    """
    arch_zoo = {
        't': dict(embed_dims=96, depths=(1, 2, 5, 2), num_heads=1),
        's': dict(embed_dims=96, depths=(1, 2, 11, 2), num_heads=1),
        'b': dict(embed_dims=96, depths=(2, 3, 16, 3), num_heads=1),
    }
    _arch_keys = ('embed_dims', 'depths', 'num_heads')
    _per_stage_keys = ('embed_dims', 'num_heads')
    _arch_prefix = 'remvit'
    not_in_pretrained = ('alpha', 'norm0.*', 'norm1.*', 'norm2.*')
    _stage_carries = True

    def __init__(self, arch: Union[str, dict] = 't', *, in_channels: int = 3, img_size: int = 224,
                 patch_cfg: Optional[dict] = None, mlp_ratio: float = 4., qkv_bias: bool = True,
                 pool_kernel: Union[int, Sequence[int]] = 3, q_stride: Union[int, Sequence[int]] = 2,
                 adaptive_kv_stride: Union[int, Sequence[int]] = 4, rel_pos: bool = True,
                 residual_pooling: bool = True, drop_path_rate: float = 0.1, learnable_alpha: bool = True,
                 out_indices: Sequence[int] = (0, 1, 2, 3), frozen_stages: int = -1, norm_eval: bool = False,
                 with_cp: bool = False, score_memory: str = 'full', fused_attn: Optional[bool] = None,
                 init_cfg: Optional[dict] = None):
        super().__init__(init_cfg=init_cfg)
        arch = self._resolve_arch(arch)
        self.fused_attn = resolve_fused_attn(fused_attn)
        self.score_memory = check_score_memory(score_memory, ('full', 'handoff'), type(self).__name__)
        depths = tuple(arch['depths'])
        num_stages = len(depths)
        dims = _per_stage(arch['embed_dims'], num_stages)
        heads = _per_stage(arch['num_heads'], num_stages)
        if any(d % h for d, h in zip(dims, heads)):
            raise ValueError(f'arch embed_dims {dims} must be divisible by num_heads {heads} in every stage')
        patch = {**dict(kernel_size=7, stride=4, padding=3), **(patch_cfg or {})}
        self._set_interface(in_channels, out_indices, num_stages, frozen_stages, norm_eval)
        self.patch_size = patch['stride']
        self.num_features = list(dims)

        self.patch_embed = PatchEmbed(in_channels, dims[0], patch['kernel_size'], patch['stride'],
                                      patch['padding'], norm=False)
        self.alpha = make_alpha(learnable_alpha)
        # every block's widths and strides first: a block's attention is told the next one's (what a handoff
        # may shrink)
        kv_stride = _pair(adaptive_kv_stride)
        side = img_size // patch['stride']  # the build-time grid fixes the relative-position table lengths
        schedule = []
        for i, depth in enumerate(depths):
            for j in range(depth):
                stride_q = _pair(q_stride) if i > 0 and j == 0 else (1, 1)
                kv_stride = tuple(max(k // q, 1) for k, q in zip(kv_stride, stride_q))
                rel_pos_size = 2 * max(side // stride_q[1], side // kv_stride[1]) - 1 if rel_pos else None
                schedule.append(dict(stage=i, dim_out=dims[i], num_heads=heads[i], stride_q=stride_q,
                                     stride_kv=kv_stride, rel_pos_size=rel_pos_size))
                side //= stride_q[1]
        rates = drop_path_rates(drop_path_rate, len(schedule))
        blocks = [[] for _ in depths]
        in_dim = dims[0]
        for n, (block, nxt) in enumerate(zip(schedule, schedule[1:] + [None])):
            stage = block.pop('stage')
            next_block = None if nxt is None else (nxt['stride_q'], nxt['stride_kv'], nxt['num_heads'])
            blocks[stage].append(
                ResidualAttentionBlock(in_dim, mlp_ratio=mlp_ratio, drop_path=rates[n], qkv_bias=qkv_bias,
                                       pool_kernel=_pair(pool_kernel), residual_pooling=residual_pooling,
                                       score_memory=score_memory,
                                       fused=self.fused_attn, next_block=next_block, **block))
            in_dim = block['dim_out']
        self.stages = nn.ModuleList(ReMViTStage(b, with_cp) for b in blocks)
        self._add_output_norms(eps=1e-6)
        self._freeze_stages()

    def _default_init(self):
        init_transformer_weights(self, _init_position_tables)

    def forward(self, x: Tensor) -> Tuple[Tensor, ...]:
        """(B, C_in, H, W) -> tuple of (B, num_features[i], ceil(H / 2**(i+2)), ceil(W / 2**(i+2)))."""
        self._check_input(x)
        return self._forward_stages(self.patch_embed(x))

    def _layer_order(self) -> LayerOrder:
        yield 'patch_embed', False
        yield from stage_layer_order(self.stages)


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

    def backbone_key(key: str) -> str:
        m = re.match(r'blocks\.(\d+)\.(.*)', key)
        if not m:
            return final_norm_key(key, len(starts) - 1)
        stage, index = place[int(m.group(1))]
        return f"stages.{stage}.blocks.{index}.{re.sub(r'^proj[.]', 'shortcut_proj.', m.group(2))}"

    return rename_release(state_dict, backbone_key), 'official-remvit' if 'alpha' in keys else 'official-mvitv2'


def _from_timm_mvitv2(state_dict) -> Dict[str, Tensor]:
    num_stages = 1 + max(int(k.split('.')[1]) for k in state_dict if k.startswith('stages.'))
    return rename_release(state_dict, lambda key: final_norm_key(key.replace('.shortcut_proj_attn.', '.shortcut_proj.'),
                                                                 num_stages - 1))
