"""onnxruntime (CPU) latency beside eager PyTorch for the T preset of every backbone form: the table in
docs/deployment.md.

    python tools/deployment/onnx_latency.py --shape 800 1216 --runs 3

Each backbone (random weights, fused inference path) is exported static at the size, checked against eager
(relative error < 1e-5) and timed: the median of ``--runs`` batch-1 forwards after one warm-up, both runtimes in
this process on the same cores. Absolute times hold for this machine only; the ratio is the comparison.
"""
import argparse
import os
import os.path as osp
import tempfile

import torch

from mmvisatt.deployment import BackboneWithNeck, export_onnx, latency
from mmvisatt.testing.cases import T_PRESET_IDS, T_PRESETS, build


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--shape', type=int, nargs=2, default=(800, 1216), metavar=('H', 'W'))
    parser.add_argument('--runs', type=int, default=3)
    parser.add_argument('--only', nargs='+', choices=T_PRESET_IDS, help='these presets only')
    args = parser.parse_args(argv)
    h, w = args.shape
    print('| backbone (T preset) | eager PyTorch (s) | onnxruntime (s) | onnxruntime / eager | relative error |\n'
          '|---|---|---|---|---|', flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for ident, (name, arch) in zip(T_PRESET_IDS, T_PRESETS):
            if args.only and ident not in args.only:
                continue
            model = BackboneWithNeck(build(name, arch=arch)).eval()
            path = osp.join(tmp, f'{ident}.onnx')
            result = export_onnx(model, path, h, w)
            eager, ort_s = latency(path, model, h, w, args.runs)
            rows.append((ident, eager, ort_s))
            print(f'| {ident} | {eager:.2f} | {ort_s:.2f} | {ort_s / eager:.2f} | {result.errors[0][1]:.1e} |',
                  flush=True)
            for f in os.listdir(tmp):
                os.remove(osp.join(tmp, f))
    print(f'{h}x{w}, batch 1, torch {torch.__version__} with {torch.get_num_threads()} threads')
    return rows


if __name__ == '__main__':
    main()
