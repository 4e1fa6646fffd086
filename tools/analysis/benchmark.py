"""Inference latency / throughput, training step time and peak memory of a backbone or a whole config.

    python tools/analysis/benchmark.py --backbone RMT --arch t --shape 800 1216
    python tools/analysis/benchmark.py configs/mask_rcnn_reswin_t_1x.py --shape 800 1216 --batch-size 2 \\
        --measure train-memory --with-cp --out bench.json
    python tools/analysis/benchmark.py --backbone reswin_t --compare mmdet.SwinTransformer --dtype bf16

The logic lives in :mod:`mmvisatt.analysis.benchmark`; ``docs/benchmarks.md`` has measured tables.
"""
from mmvisatt.analysis.benchmark import cli

if __name__ == '__main__':
    cli()
