"""Per-head spatial-decay masks and the effective receptive field of one token, for RMT and EVT backbones.

    python tools/analysis/decay_masks.py CONFIG_OR_ARCH [CHECKPOINT] --out-dir DIR \
        [--stage 0] [--block 0] [--size 224] [--query Y X] [--no-erf]

Writes ``decay_masks_stage{S}.png``, ``erf_stage{S}.png`` and ``decay_masks.json``; see docs/rmt.md and
docs/evt.md. The logic lives in :mod:`mmvisatt.analysis.decay`.
"""
from mmvisatt.analysis.decay import main

if __name__ == '__main__':
    main()
