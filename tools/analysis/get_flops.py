"""Parameters and FLOPs (multiply-adds, the papers' "FLOPs") of any config's model, without a dataset.

    python tools/analysis/get_flops.py configs/mask_rcnn_reswin_t_3x.py
    python tools/analysis/get_flops.py configs/upernet_rmt_t_160k_ade20k.py --shape 512 512

The count is the model zoo's (mmvisatt.analysis.model_zoo.complexity): one batch-1 inference forward at the
input size (default: 1280x800 for mmdet, 2048x512 for mmseg, 224x224 for mmpretrain), matrix products,
attention and convolutions; a detector's RoI heads on 1000 proposals and its mask head on 100 RoIs, as the papers
count them. docs/model_zoo.md lists every config's.
"""
import argparse

from mmengine.config import DictAction

from mmvisatt.analysis.model_zoo import complexity


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('config')
    parser.add_argument('--shape', type=int, nargs=2, metavar=('H', 'W'), help='input height and width')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, default={}, metavar='KEY=VALUE')
    args = parser.parse_args(argv)
    result = complexity(args.config, args.shape, args.cfg_options)
    h, w = result['input_hw']
    print(f"{args.config} at {w}x{h} ({result['scope']}):\n"
          f"  model:    {result['params'] / 1e6:.2f}M params, {result['macs'] / 1e9:.2f} GFLOPs (multiply-adds)\n"
          f"  backbone: {result['backbone_params'] / 1e6:.2f}M params, {result['backbone_macs'] / 1e9:.2f} GFLOPs")
    return result


if __name__ == '__main__':
    main()
