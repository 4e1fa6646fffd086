"""The ReViT paper's analyses as library functions: attention non-locality, feature collapse, attention maps and
the residual gates, read from a model through forward hooks (the model is never edited).

``tools/analysis/*.py`` are the command-line faces; ``docs/analysis.md`` explains the numbers.
"""
from .attention_maps import AttentionMap, attention_map, attention_maps, query_attention, resolve_layers
from .capture import (AttentionCapture, BlockOutputCapture, PooledAttentionRecord, UnsupportedModelError,
                      WindowAttentionRecord, attention_layers)
from .feature_collapse import FeatureCollapseResult, feature_collapse, mean_pairwise_cosine
from .inputs import ImageBatch, build_backbone, load_images
from .non_locality import (LayerNonLocality, NonLocalityResult, non_locality, pooled_non_locality,
                           record_non_locality, window_non_locality)
from .plotting import plot_attention_map, plot_feature_collapse, plot_non_locality
from .summary import Gate, format_summary, model_summary, parameter_table, residual_gates

__all__ = [
    'AttentionMap', 'attention_map', 'attention_maps', 'query_attention', 'resolve_layers', 'AttentionCapture',
    'BlockOutputCapture', 'PooledAttentionRecord', 'UnsupportedModelError', 'WindowAttentionRecord',
    'attention_layers', 'FeatureCollapseResult', 'feature_collapse', 'mean_pairwise_cosine', 'ImageBatch',
    'build_backbone', 'load_images', 'LayerNonLocality', 'NonLocalityResult', 'non_locality',
    'pooled_non_locality', 'record_non_locality', 'window_non_locality', 'plot_attention_map',
    'plot_feature_collapse', 'plot_non_locality', 'Gate', 'format_summary', 'model_summary', 'parameter_table',
    'residual_gates'
]
