"""Attention maps of chosen layers for one query position (default the image centre), over the input images.

    python tools/analysis/attention_maps.py CONFIG_OR_ARCH CHECKPOINT IMAGE_DIR --out-dir DIR \
        [--layers 0 -1 stages.2.blocks.5] [--query Y X] [--size 224]

Writes one PNG per image and layer plus ``attention_maps.json``; see docs/analysis.md. The logic lives in
:mod:`mmvisatt.analysis`.
"""
from mmvisatt.analysis.cli import attention_maps_main, run

if __name__ == '__main__':
    run(attention_maps_main)
