"""Train a detector or segmentor: ``python tools/train.py CONFIG [--demo] [--resume [PATH]] [--cfg-options ...]``.

The logic lives in :mod:`mmvisatt.engine.entrypoints`; run with ``--help`` for every option.
"""
from mmvisatt.engine.entrypoints import run_tool, train_main

if __name__ == '__main__':
    run_tool(train_main)
