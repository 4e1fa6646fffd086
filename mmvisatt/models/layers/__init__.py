from .attention import attention, resolve_fused_attn
from .channel_attention import (ConvValueMlp, DepthwiseConvBlock, EfficientChannelAttention, TokenAttention,
                                channel_gate)
from .checkpoint import checkpoint, checkpoint_seq
from .layout import map_to_tokens, tokens_to_map
from .patch import PatchEmbed, PatchMerging
from .pooling_attention import PoolingResidualAttention, add_decomposed_rel_pos, relative_position_embeddings
from .residual_attention import (PooledScores, ScoreFactors, TokenGrid, WindowScores, align_by_position, align_by_slot,
                                 align_pooled_by_position, align_pooled_official, mix_scores, regrid_by_position)
from .retentive import ConvDownsample, ConvFFN, ConvStem, RetentiveBlock
from .shunted_attention import HeadGroupKV, ShuntedAttention
from .simple_pyramid import SimpleFeaturePyramid
from .spatial_decay import (GroupRun, SpatialDecay, TokenGroups, decay_bias, grid_distance, group_bias, group_runs,
                            group_tokens, grouped_attention_fused, head_decay_rates, line_distance, token_groups,
                            ungroup_tokens)
from .window import (WindowGrid, merge_windows, partition_windows, relative_position_index, window_attention_mask,
                     window_partition, window_reverse)

__all__ = [
    'attention', 'resolve_fused_attn', 'checkpoint', 'checkpoint_seq', 'PatchEmbed', 'PatchMerging',
    'ConvDownsample', 'ConvFFN', 'ConvStem', 'RetentiveBlock', 'PoolingResidualAttention', 'add_decomposed_rel_pos',
    'relative_position_embeddings', 'PooledScores', 'ScoreFactors', 'TokenGrid', 'WindowScores', 'align_by_position',
    'align_by_slot', 'align_pooled_by_position', 'align_pooled_official', 'mix_scores', 'regrid_by_position',
    'SimpleFeaturePyramid', 'SpatialDecay', 'TokenGroups', 'GroupRun', 'decay_bias', 'grid_distance', 'group_bias',
    'group_runs', 'group_tokens', 'grouped_attention_fused', 'head_decay_rates', 'line_distance', 'token_groups',
    'ungroup_tokens', 'WindowGrid', 'merge_windows', 'partition_windows', 'relative_position_index',
    'window_attention_mask', 'window_partition', 'window_reverse', 'HeadGroupKV', 'ShuntedAttention', 'ConvValueMlp',
    'DepthwiseConvBlock', 'EfficientChannelAttention', 'TokenAttention', 'channel_gate', 'map_to_tokens',
    'tokens_to_map'
]
