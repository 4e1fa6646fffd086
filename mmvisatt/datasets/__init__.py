"""Datasets shipped with mmvisatt.

Only synthetic demo data lives here: small COCO-, ADE20K- and ImageNet-format
sets that are generated on first use, so the real detection, segmentation and
classification pipelines can be exercised without downloading anything.
"""
from .demo import (DEMO_ADE_CLASSES, DEMO_COCO_CLASSES, demo_data_root,
                   prepare_demo_ade, prepare_demo_coco, prepare_demo_imagenet)

__all__ = [
    'DEMO_COCO_CLASSES', 'DEMO_ADE_CLASSES', 'demo_data_root',
    'prepare_demo_coco', 'prepare_demo_ade', 'prepare_demo_imagenet'
]
