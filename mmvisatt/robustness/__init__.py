"""Corruption robustness: the 15 ImageNet-C / COCO-C corruptions as a pipeline transform (``CorruptImage``, registered
in mmengine's root TRANSFORMS on import) and the benchmark behind ``tools/analysis/corruption_benchmark.py``."""
from .benchmark import insert_corruption, markdown_table, run_benchmark, select_metrics, summarize
from .corruptions import CORRUPTION_GROUPS, CORRUPTIONS, SEVERITIES, CorruptImage, corrupt_image, image_seed

__all__ = ['CORRUPTIONS', 'CORRUPTION_GROUPS', 'SEVERITIES', 'CorruptImage', 'corrupt_image', 'image_seed',
           'insert_corruption', 'markdown_table', 'run_benchmark', 'select_metrics', 'summarize']
