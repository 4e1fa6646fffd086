"""What a training step of every T preset would do on a GPU, measured on the meta device (docs/performance.md,
"GPU readiness"): ATen ops at batch 1 and 8, host tensors per step, and graphs compiled at three padded sizes of
the 3x multi-scale range under ``torch.compile(dynamic=True)``.

    python tools/analysis/gpu_readiness.py                      # op counts and host tensors, seconds per preset
    python tools/analysis/gpu_readiness.py --compile            # adds the compile counts (minutes per preset)
    python tools/analysis/gpu_readiness.py --compile --presets ReMViTv2-t --kwargs score_memory=\'handoff\'

Each preset is built under ``torch.device('meta')`` in training mode; a step is forward + backward of the
mean of every output (:mod:`mmvisatt.testing.device_audit`). The compile counts use the preset's widths and
attention layout with one block per stage (two for the plain ViTs), which leaves every stage geometry and shape
branch in place: the symbolic-shape tracing costs minutes per model here whatever the depth.
"""
import argparse
import ast
import json
from typing import List, Optional

from mmvisatt.testing.cases import T_PRESETS, one_block_per_stage
from mmvisatt.testing.device_audit import audit_training_step, build_on_device, count_compiles

OP_SHAPE = (256, 320)
NON_SQUARE = (224, 288)
# padded (to 32) sizes of 4:3 images under the 3x recipe's shorter sides 480 / 640 / 800
COMPILE_SIZES = ((480, 640), (640, 864), (800, 1088))


def measure(name: str, arch: str, kwargs: dict, compile_sizes: Optional[tuple]) -> dict:
    model = build_on_device(name, arch, 'meta', **kwargs)
    one = audit_training_step(model, 1, *OP_SHAPE)
    eight = audit_training_step(model, 8, *OP_SHAPE)
    odd = audit_training_step(model, 2, *NON_SQUARE)
    row = dict(preset=f'{name}-{arch}', kwargs=kwargs, ops_1=one.ops, ops_8=eight.ops,
               growth=eight.ops / one.ops - 1, host_tensors=len(one.foreign) + len(eight.foreign) + len(odd.foreign))
    if compile_sizes:
        shallow = build_on_device(name, one_block_per_stage(name, arch), 'meta', **kwargs)
        row['graphs'] = count_compiles(shallow, compile_sizes)
    return row


def main(argv: Optional[List[str]] = None) -> List[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--presets', nargs='+', metavar='TYPE-ARCH',
                        help='e.g. ReSwinTransformer-t (default: every T preset)')
    parser.add_argument('--kwargs', nargs='+', default=[], metavar='KEY=VALUE',
                        help="backbone arguments, e.g. score_memory='handoff' (Python literals)")
    parser.add_argument('--compile', action='store_true', help='also count compiled graphs (slow)')
    parser.add_argument('--json', metavar='FILE', help='write the rows as JSON')
    args = parser.parse_args(argv)
    kwargs = {k: ast.literal_eval(v) for k, v in (item.split('=', 1) for item in args.kwargs)}
    presets = T_PRESETS if not args.presets else [tuple(p.rsplit('-', 1)) for p in args.presets]
    rows = []
    print(f'| preset | ATen ops, batch 1 | batch 8 | growth | host tensors |'
          f'{" graphs at " + ", ".join(f"{h}x{w}" for h, w in COMPILE_SIZES) + " |" if args.compile else ""}')
    for name, arch in presets:
        row = measure(name, arch, kwargs, COMPILE_SIZES if args.compile else None)
        rows.append(row)
        graphs = f' {" / ".join(map(str, row["graphs"]))} |' if 'graphs' in row else ''
        print(f'| {row["preset"]} | {row["ops_1"]} | {row["ops_8"]} | {row["growth"]:+.1%} | '
              f'{row["host_tensors"]} |{graphs}', flush=True)
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(rows, f, indent=1)
    return rows


if __name__ == '__main__':
    main()
