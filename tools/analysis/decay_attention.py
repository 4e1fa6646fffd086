"""RMT's / EVT's full-grid decayed attention: the decay-mask SDPA path against a FlexAttention ``score_mod`` path
that never builds the N x N mask, forward + backward time and peak memory per stage.

    python tools/analysis/decay_attention.py --device cuda --shape 800 1333 --batch-size 2 --dtype bf16
    python tools/analysis/decay_attention.py --device cpu --shape 224 320 --no-compile   # values, forward only

The logic lives in ``tools/analysis/decay_kernels.py``.
"""
import argparse
import json

from benchmark import DTYPES  # tools/analysis, beside this file
from decay_kernels import compare_decay_kernels, decay_stages

import mmvisatt.models  # noqa: F401  (registers the backbones)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--presets', nargs='+', default=['rmt_t', 'evt_t'], help='rmt_<size> / evt_<size>')
    parser.add_argument('--shape', type=int, nargs=2, default=[800, 1333], metavar=('H', 'W'))
    parser.add_argument('--batch-size', type=int, default=2)
    parser.add_argument('--dtype', choices=sorted(DTYPES), default='bf16')
    parser.add_argument('--device', default='cuda')
    parser.add_argument('--no-compile', action='store_true',
                        help="eager flex_attention (it materialises the scores: checks values, not speed)")
    parser.add_argument('--warmup', type=int, default=3)
    parser.add_argument('--repeats', type=int, default=10)
    parser.add_argument('--out', metavar='FILE.json')
    args = parser.parse_args(argv)
    rows = []
    for preset in args.presets:
        for stage in decay_stages(preset, tuple(args.shape)):
            results = compare_decay_kernels(stage, args.batch_size, DTYPES[args.dtype], args.device,
                                            not args.no_compile, args.warmup, args.repeats)
            for way, result in results.items():
                rows.append(dict(stage=stage['name'], grid=stage['grid'], heads=stage['heads'], way=way, **result))
                peak = result['step_peak_mib']
                print(f"{stage['name']} ({stage['grid'][0]}x{stage['grid'][1]} tokens, {stage['heads']} heads) "
                      f"{way}: {result['time_ms']:.2f} ms {result['passes']}"
                      + ('' if peak is None else f', step peak {peak:.0f} MiB')
                      + f", outputs differ by {result['relative_difference']:.1e} of their largest", flush=True)
    if args.out:
        with open(args.out, 'w') as f:
            json.dump(dict(settings=vars(args), rows=rows), f, indent=2)
    return rows


if __name__ == '__main__':
    main()
