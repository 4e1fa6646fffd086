"""Did a short training run train? Read from its work dir's logs: the loss fell, every logged loss is finite, the
peak GPU memory (mmengine logs ``memory``, ``max_memory_allocated`` in MB, on CUDA) and the iterations per second.

    python tools/analysis/train_check.py WORK_DIR [--window 20] [--out check.json]

The loss has fallen when the mean of the last ``window`` logged values is below the mean of the first ``window``.
Exit status 1 when it has not, or when a loss is not finite. ``tools/gpu_check.sh`` runs it after its Mask R-CNN
training.
"""
import argparse
import json
import math
import statistics
import sys
from typing import Any, Dict, Optional, Sequence

from mmvisatt.analysis.logs import load_training_log


def check_training(work_dir: str, window: int = 20) -> Dict[str, Any]:
    log = load_training_log(work_dir)
    loss = [value for _, value in log.train.get('loss', [])]
    if not loss:
        raise ValueError(f'{work_dir}: no training loss logged')
    window = max(1, min(window, len(loss) // 2 or 1))
    losses = {key: [v for _, v in points] for key, points in log.train.items() if key.startswith('loss')}
    non_finite = sorted(key for key, values in losses.items() if not all(math.isfinite(v) for v in values))
    first, last = statistics.mean(loss[:window]), statistics.mean(loss[-window:])
    times = [value for _, value in log.train.get('time', [])]
    memory = [value for _, value in log.train.get('memory', [])]
    iterations = log.train['loss'][-1][0]
    result = dict(iterations=iterations, loss_first=round(first, 4), loss_last=round(last, 4),
                  loss_fell=last < first, non_finite=non_finite,
                  iter_per_s=round(1 / statistics.median(times), 2) if times else None,
                  max_memory_allocated_mb=max(memory) if memory else None)
    result['ok'] = result['loss_fell'] and not non_finite
    return result


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('work_dir')
    parser.add_argument('--window', type=int, default=20, help='logged values averaged at each end')
    parser.add_argument('--out', help='also write the result as JSON here')
    args = parser.parse_args(argv)
    result = check_training(args.work_dir, args.window)
    text = json.dumps(result)
    print(text)
    if args.out:
        with open(args.out, 'w') as f:
            f.write(text + '\n')
    return 0 if result['ok'] else 1


if __name__ == '__main__':
    sys.exit(main())
