"""Feature collapse: mean pairwise cosine similarity of the tokens after every block.

    python tools/analysis/feature_collapse.py CONFIG_OR_ARCH CHECKPOINT IMAGE_DIR --out-dir DIR [--size 224]

Writes ``feature_collapse.png`` and ``feature_collapse.json``; see docs/analysis.md. The logic lives in
:mod:`mmvisatt.analysis`.
"""
from mmvisatt.analysis.cli import feature_collapse_main, run

if __name__ == '__main__':
    run(feature_collapse_main)
