"""Attention non-locality per head and layer (ReViT eq. 11/12): mean query-key distance in input pixels.

    python tools/analysis/non_locality.py CONFIG_OR_ARCH CHECKPOINT IMAGE_DIR --out-dir DIR [--size 224]

Writes ``non_locality.png`` (layer on x, one line per head) and ``non_locality.json``; see docs/analysis.md.
The logic lives in :mod:`mmvisatt.analysis`.
"""
from mmvisatt.analysis.cli import non_locality_main, run

if __name__ == '__main__':
    run(non_locality_main)
