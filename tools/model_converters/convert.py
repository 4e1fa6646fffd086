"""Convert an official / timm / mm checkpoint to an mmvisatt (mm-style) file.

    python tools/model_converters/convert.py swin_tiny_patch4_window7_224.pth checkpoints/reswin_t_mm.pth

The output holds ``{'state_dict': {'backbone.*': ..., 'head.fc.*': ...}}`` and loads with
``init_cfg=dict(type='Pretrained', checkpoint=OUT)`` (or ``prefix='backbone.'`` in stock mm backbones).
"""
import argparse
import sys

import mmvisatt.models  # noqa: F401  (registers the family converters)
from mmvisatt.checkpoint import (CheckpointMismatchError, NotACheckpointError, UnsafeCheckpointError,
                                 convert_checkpoint_file, registered_families)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('src', help='checkpoint file or URL in any supported layout')
    parser.add_argument('dst', help='output path')
    parser.add_argument('--family', choices=registered_families(),
                        help='family of the checkpoint (default: detected from its keys)')
    args = parser.parse_args(argv)
    try:
        family, layout, count = convert_checkpoint_file(args.src, args.dst, args.family)
    except (FileNotFoundError, NotACheckpointError, CheckpointMismatchError, UnsafeCheckpointError) as error:
        sys.exit(f'convert: {error}')
    print(f'{args.src}: {family} checkpoint in {layout} layout -> {args.dst} ({count} tensors)')


if __name__ == '__main__':
    main()
