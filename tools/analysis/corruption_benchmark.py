"""Corruption robustness (COCO-C protocol): a checkpoint evaluated on clean and corrupted test images.

    python tools/analysis/corruption_benchmark.py CONFIG CHECKPOINT [--corruptions fog noise ...]
        [--severities 1 3 5] [--demo] [--out-dir DIR] [--cfg-options KEY=VALUE ...]

Writes ``corruption_benchmark.{json,md,png}`` (per-corruption metrics, mPC, rPC) to the output directory; see
docs/robustness.md. The logic lives in :mod:`mmvisatt.robustness`.
"""
from mmvisatt.engine.entrypoints import run_tool
from mmvisatt.robustness.benchmark import main

if __name__ == '__main__':
    run_tool(main)
