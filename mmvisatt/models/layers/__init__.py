from .residual_attention import WindowScores, align_by_position, align_by_slot, mix_scores
from .window import (WindowGrid, merge_windows, partition_windows, relative_position_index,
                     window_attention_mask, window_partition, window_reverse)

__all__ = [
    'WindowScores', 'align_by_position', 'align_by_slot', 'mix_scores', 'WindowGrid', 'merge_windows',
    'partition_windows', 'relative_position_index', 'window_attention_mask', 'window_partition', 'window_reverse'
]
