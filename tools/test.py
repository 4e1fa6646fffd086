"""Evaluate a checkpoint: ``python tools/test.py CONFIG CHECKPOINT [--demo] [--out FILE] [--cfg-options ...]``.

The logic lives in :mod:`mmvisatt.engine.entrypoints`; run with ``--help`` for every option.
"""
from mmvisatt.engine.entrypoints import run_tool, test_main

if __name__ == '__main__':
    run_tool(test_main)
