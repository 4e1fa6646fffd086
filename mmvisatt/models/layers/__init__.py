from .attention import attention, resolve_fused_attn
from .channel_attention import (ConvValueMlp, DepthwiseConvBlock, EfficientChannelAttention, TokenAttention,
                                channel_gate)
from .checkpoint import checkpoint, checkpoint_seq
from .patch import PatchEmbed, PatchMerging, map_to_tokens, tokens_to_map
from .pooling_attention import PoolingResidualAttention, ResidualAttentionBlock, relative_position_embeddings
from .residual_attention import (PooledScores, ScoreFactors, TokenGrid, WindowScores, align_by_position, align_by_slot,
                                 align_pooled_by_position, make_alpha,
                                 regrid_by_position, residual_attention)
from .score_memory import RowChunkAttention, ScoreReduction, score_chunk_numel, set_score_chunk_numel
from .retentive import ConvDownsample, ConvFFN, ConvStem, RetentiveBlock
from .shunted_attention import HeadGroupKV, ShuntedAttention
from .simple_pyramid import SimpleFeaturePyramid
from .spatial_decay import (SpatialDecay, TokenGroups, decay_bias, grid_distance, group_bias, group_tokens,
                            head_decay_rates, line_distance, token_groups, ungroup_tokens)
from .window import (WindowGrid, merge_windows, partition_windows, relative_position_index, window_attention_mask,
                     window_partition, window_reverse)

__all__ = [
    'attention', 'resolve_fused_attn', 'ConvValueMlp', 'DepthwiseConvBlock', 'EfficientChannelAttention',
    'TokenAttention', 'channel_gate', 'checkpoint', 'checkpoint_seq', 'PatchEmbed', 'PatchMerging', 'map_to_tokens',
    'tokens_to_map', 'PoolingResidualAttention', 'ResidualAttentionBlock', 'relative_position_embeddings',
    'PooledScores', 'ScoreFactors', 'TokenGrid', 'WindowScores', 'align_by_position', 'align_by_slot',
    'align_pooled_by_position', 'make_alpha', 'regrid_by_position',
    'residual_attention', 'RowChunkAttention', 'ScoreReduction', 'score_chunk_numel', 'set_score_chunk_numel',
    'ConvDownsample', 'ConvFFN', 'ConvStem', 'RetentiveBlock', 'HeadGroupKV', 'ShuntedAttention',
    'SimpleFeaturePyramid', 'SpatialDecay', 'TokenGroups', 'decay_bias', 'grid_distance', 'group_bias',
    'group_tokens', 'head_decay_rates', 'line_distance', 'token_groups', 'ungroup_tokens', 'WindowGrid',
    'merge_windows', 'partition_windows', 'relative_position_index', 'window_attention_mask', 'window_partition',
    'window_reverse'
]
