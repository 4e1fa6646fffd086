from .channel_attention import (ConvValueMlp, DepthwiseConvBlock, EfficientChannelAttention, TokenAttention,
                                channel_gate, multi_head_attention)
from .layout import map_to_tokens, tokens_to_map
from .pooling_attention import PoolingResidualAttention, add_decomposed_rel_pos, relative_position_embeddings
from .residual_attention import (PooledScores, ScoreFactors, TokenGrid, WindowScores, align_by_position, align_by_slot,
                                 align_pooled_by_position, align_pooled_official, mix_scores, regrid_by_position)
from .shunted_attention import HeadGroupKV, ShuntedAttention
from .simple_pyramid import SimpleFeaturePyramid
from .spatial_decay import (GroupRun, SpatialDecay, TokenGroups, decay_bias, decayed_attention, grid_distance,
                            group_bias, group_runs, group_tokens, grouped_attention_fused, head_decay_rates,
                            line_distance, token_groups, ungroup_tokens)
from .strips import row_strips, strip_rows
from .window import (WindowGather, WindowGrid, merge_windows, partition_windows, relative_position_index,
                     window_attention_mask, window_gather, window_partition, window_reverse)

__all__ = [
    'PoolingResidualAttention', 'add_decomposed_rel_pos', 'relative_position_embeddings', 'PooledScores',
    'ScoreFactors',    'TokenGrid', 'WindowScores', 'align_by_position', 'align_by_slot', 'align_pooled_by_position',
    'align_pooled_official', 'mix_scores', 'regrid_by_position', 'SimpleFeaturePyramid', 'SpatialDecay',
    'TokenGroups', 'GroupRun', 'decay_bias', 'decayed_attention', 'grid_distance', 'group_bias', 'group_runs',
    'group_tokens', 'grouped_attention_fused',
    'head_decay_rates', 'line_distance', 'token_groups', 'ungroup_tokens', 'WindowGrid',
    'merge_windows', 'partition_windows', 'relative_position_index', 'window_attention_mask', 'window_partition',
    'window_reverse', 'HeadGroupKV', 'ShuntedAttention', 'ConvValueMlp', 'DepthwiseConvBlock',
    'EfficientChannelAttention', 'TokenAttention', 'channel_gate', 'multi_head_attention', 'map_to_tokens',
    'tokens_to_map', 'row_strips', 'strip_rows', 'WindowGather', 'window_gather'
]
