"""Export a config's backbone (and optionally its FPN neck) to ONNX and check it against eager PyTorch.

    python tools/deployment/export_onnx.py configs/mask_rcnn_reswin_t_1x_coco.py --shape 800 1216
    python tools/deployment/export_onnx.py CONFIG work_dirs/x/epoch_12.pth --shape 800 1216 --dynamic --with-neck

The graph is written with torch's current exporter (``dynamo=True``, opset 18) from the fused inference path and
run in onnxruntime (CPU) beside the eager model: at the export size and, with ``--dynamic``, at two other sizes
that are not multiples of any window or group size. A model whose height and width cannot be dynamic is exported
with static shapes, and the report says why. The checkpoint may be a whole trained model (its ``backbone.`` and
``neck.`` weights are used) or a backbone checkpoint in any layout the converter reads. docs/deployment.md.
"""
import argparse
import os
import os.path as osp
import sys

from mmengine.config import DictAction

from mmvisatt.checkpoint import UnsafeCheckpointError
from mmvisatt.deployment import ExportError, build_export_model, export_onnx


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('config')
    parser.add_argument('checkpoint', nargs='?', help='weights (default: the random initialisation)')
    parser.add_argument('--shape', type=int, nargs=2, required=True, metavar=('H', 'W'), help='export size')
    parser.add_argument('--dynamic', action='store_true', help='dynamic input height and width')
    parser.add_argument('--with-neck', action='store_true', help="export the config's neck (FPN) too")
    parser.add_argument('--out', help='output file (default: next to the checkpoint or in work_dirs/onnx)')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, default={}, metavar='KEY=VALUE')
    args = parser.parse_args(argv)
    name = osp.splitext(osp.basename(args.config))[0]
    out = args.out or osp.join(osp.dirname(args.checkpoint) if args.checkpoint else osp.join('work_dirs', 'onnx'),
                               name + ('_neck' if args.with_neck else '') + '.onnx')
    if osp.dirname(out):
        os.makedirs(osp.dirname(out), exist_ok=True)
    try:
        model = build_export_model(args.config, args.checkpoint, args.with_neck, args.cfg_options)
        result = export_onnx(model, out, *args.shape, dynamic=args.dynamic)
    except (ExportError, UnsafeCheckpointError) as err:
        sys.exit(f'export_onnx: {err}')
    parts = type(model.backbone).__name__ + (f' + {type(model.neck).__name__}' if model.neck is not None else '')
    print(result.line(f'{name} ({parts})'))
    return result


if __name__ == '__main__':
    main()
