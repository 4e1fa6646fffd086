"""Measure parameters and FLOPs of every task config and write the model zoo beside the papers' numbers.

    python tools/analysis/model_zoo.py [--configs GLOB] [--out docs/model_zoo.md] [--json] [--no-flops]

Measurements are cached in ``<out>.json`` (per config, keyed by the resolved config's hash), so reruns are
incremental. The logic lives in :mod:`mmvisatt.analysis.model_zoo`.
"""
from mmvisatt.analysis.model_zoo import main

if __name__ == '__main__':
    main()
