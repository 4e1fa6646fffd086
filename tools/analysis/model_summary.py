"""Model summary: parameters per stage and every residual gate (alpha) with its value and whether it learns.

    python tools/analysis/model_summary.py CONFIG_OR_ARCH [CHECKPOINT] [--json PATH]

The logic lives in :mod:`mmvisatt.analysis`.
"""
from mmvisatt.analysis.cli import model_summary_main, run

if __name__ == '__main__':
    run(model_summary_main)
