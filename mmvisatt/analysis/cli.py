"""Command-line faces of the analysis (``tools/analysis/*.py`` call these ``main`` functions).

Every tool takes ``CONFIG_OR_ARCH CHECKPOINT``: an mm config file whose ``model.backbone`` is built, or a
backbone spec ``Type[:arch]`` (``ReSwinTransformer:t``); the checkpoint is any layout the backbone family loads,
or ``none`` for random weights.
"""
import argparse
import json
import os
import os.path as osp
import sys
from typing import Callable, List, Optional, Sequence

import torch
from mmengine.config import DictAction

from mmvisatt.checkpoint import CheckpointMismatchError, UnsafeCheckpointError, registered_families

from .attention_maps import attention_maps
from .capture import UnsupportedModelError
from .feature_collapse import feature_collapse
from .inputs import build_backbone, image_size, load_images
from .non_locality import non_locality
from .plotting import plot_attention_map, plot_feature_collapse, plot_non_locality
from .summary import format_summary, model_summary, residual_gates

_EXPECTED_ERRORS = (UnsupportedModelError, CheckpointMismatchError, UnsafeCheckpointError, FileNotFoundError,
                    ValueError, KeyError)


def _parser(description: str, images: bool = True, max_images: int = 16) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('model', metavar='CONFIG_OR_ARCH',
                        help="config file with model.backbone, or a backbone spec 'Type[:arch]', e.g. "
                             "ReSwinTransformer:t, ReViT:b, ReMViTv2:t")
    if images:
        parser.add_argument('checkpoint', help="checkpoint file/URL in any supported layout, or 'none'")
        parser.add_argument('image_dir', help='folder of images (png/jpg/...), read in name order')
        parser.add_argument('--out-dir', default='work_dirs/analysis', help='where PNGs and JSON are written')
        parser.add_argument('--size', type=int, nargs='+', default=[224], metavar='N',
                            help='resize images to N x N (or H W) pixels (default 224)')
        parser.add_argument('--max-images', type=int, default=max_images,
                            help=f'use the first N images of the folder (default {max_images}; 0 = all)')
        parser.add_argument('--batch-size', type=int, default=4)
        parser.add_argument('--device', default='cpu')
    else:
        parser.add_argument('checkpoint', nargs='?', default='none',
                            help="checkpoint file/URL in any supported layout, or 'none' (default)")
    parser.add_argument('--family', choices=registered_families() or None,
                        help='checkpoint family (default: the one of the backbone type)')
    parser.add_argument('--backbone-options', nargs='+', action=DictAction, default={}, metavar='KEY=VALUE',
                        help='override backbone arguments, e.g. residual_mode=official img_size=256')
    parser.add_argument('--seed', type=int, default=0, help='seed of the random initialisation')
    return parser


def _build(args: argparse.Namespace):
    backbone, report = build_backbone(args.model, args.checkpoint, family=args.family,
                                      options=args.backbone_options, seed=args.seed)
    return backbone.to(getattr(args, 'device', 'cpu')), report


def _write_json(data: dict, path: str) -> None:
    os.makedirs(osp.dirname(osp.abspath(path)), exist_ok=True)
    with open(path, 'w') as f:
        json.dump(data, f, indent=2)


def _header(args: argparse.Namespace, backbone: torch.nn.Module, num_images: int) -> dict:
    return dict(model=args.model, backbone=type(backbone).__name__, checkpoint=args.checkpoint,
                images=osp.abspath(args.image_dir), num_images=num_images,
                gates=[dict(name=g.name, value=g.value, kind=g.kind, learnable=g.learnable)
                       for g in residual_gates(backbone)])


def run(main: Callable[[Optional[Sequence[str]]], None], argv: Optional[Sequence[str]] = None) -> None:
    """Run a tool; an error the user can fix (bad path, unsupported model, checkpoint mismatch) ends it with
    its message instead of a traceback."""
    try:
        main(argv)
    except _EXPECTED_ERRORS as error:
        sys.exit(f'error: {error.args[0] if isinstance(error, KeyError) and error.args else error}')


def non_locality_main(argv: Optional[Sequence[str]] = None) -> None:
    parser = _parser('Per-head, per-layer attention non-locality (mean query-key distance in pixels): '
                     'non_locality.png and non_locality.json in --out-dir.')
    args = parser.parse_args(argv)
    backbone, _ = _build(args)
    images = load_images(args.image_dir, image_size(args.size), args.max_images or None)
    result = non_locality(backbone, images.tensor, args.batch_size)
    data = {**_header(args, backbone, len(images.paths)), **result.to_dict()}
    _write_json(data, osp.join(args.out_dir, 'non_locality.json'))
    plot_non_locality(result, osp.join(args.out_dir, 'non_locality.png'),
                      f'Non-locality of {type(backbone).__name__} ({len(images.paths)} images, '
                      f'{result.image_size[0]}x{result.image_size[1]})')
    print(f'{"layer":>5}  {"block":<24} {"kind":<7} {"stride":>6}  {"mean px":>8}  per head')
    for i, layer in enumerate(result.layers):
        heads = ' '.join(f'{v:.1f}' for v in layer.heads)
        print(f'{i:>5}  {layer.name:<24} {layer.kind:<7} {layer.stride[0]:>6}  {layer.mean:>8.2f}  {heads}')
    print(f'wrote {osp.join(args.out_dir, "non_locality.png")} and non_locality.json')


def feature_collapse_main(argv: Optional[Sequence[str]] = None) -> None:
    parser = _parser('Mean pairwise cosine similarity of the tokens after every block (feature collapse): '
                     'feature_collapse.png and feature_collapse.json in --out-dir.')
    args = parser.parse_args(argv)
    backbone, _ = _build(args)
    images = load_images(args.image_dir, image_size(args.size), args.max_images or None)
    result = feature_collapse(backbone, images.tensor, args.batch_size)
    data = {**_header(args, backbone, len(images.paths)), **result.to_dict()}
    _write_json(data, osp.join(args.out_dir, 'feature_collapse.json'))
    plot_feature_collapse(result, osp.join(args.out_dir, 'feature_collapse.png'),
                          f'Feature collapse of {type(backbone).__name__} ({len(images.paths)} images, '
                          f'{result.image_size[0]}x{result.image_size[1]})')
    print(f'{"layer":>5}  {"block":<24} {"tokens":>7}  similarity')
    for i, (name, sim, tokens) in enumerate(zip(result.names, result.similarity, result.num_tokens)):
        print(f'{i:>5}  {name:<24} {tokens:>7}  {sim:.4f}')
    print(f'wrote {osp.join(args.out_dir, "feature_collapse.png")} and feature_collapse.json')


def _layer_keys(values: Optional[List[str]]):
    return None if not values else [int(v) if v.lstrip('-').isdigit() else v for v in values]


def attention_maps_main(argv: Optional[Sequence[str]] = None) -> None:
    parser = _parser('Attention of one query position over the image, for chosen layers: one PNG per image and '
                     'layer (head mean and every head) in --out-dir, indexed in attention_maps.json.',
                     max_images=2)
    parser.add_argument('--layers', nargs='+', metavar='LAYER',
                        help='layer indices (negative from the end) or block names; default: the first layer '
                             'and the last layer of every stage')
    parser.add_argument('--query', type=float, nargs=2, metavar=('Y', 'X'),
                        help='query position in pixels of the resized image (default: the image centre)')
    args = parser.parse_args(argv)
    backbone, _ = _build(args)
    images = load_images(args.image_dir, image_size(args.size), args.max_images or None)
    maps = attention_maps(backbone, images.tensor, _layer_keys(args.layers), args.query, args.batch_size)
    entries = []
    for item in maps:
        stem = osp.splitext(osp.basename(images.paths[item.image_index]))[0]
        path = osp.join(args.out_dir, f'{stem}_layer{item.index:02d}.png')
        plot_attention_map(images.pixels[item.image_index], item, path)
        peak = divmod(int(item.maps.mean(0).argmax()), item.maps.shape[-1])
        entries.append(dict(image=images.paths[item.image_index], layer=item.index, name=item.name,
                            kind=item.kind, query=list(item.query), heads=item.maps.shape[0],
                            mean_peak=list(peak), file=path))
        print(f'{path}: layer {item.index} ({item.name}), {item.maps.shape[0]} heads')
    _write_json({**_header(args, backbone, len(images.paths)), 'maps': entries},
                osp.join(args.out_dir, 'attention_maps.json'))


def model_summary_main(argv: Optional[Sequence[str]] = None) -> None:
    parser = _parser('Parameters per stage and the residual gates (alpha) of a backbone.', images=False)
    parser.add_argument('--json', metavar='PATH', help='also write the summary as JSON')
    args = parser.parse_args(argv)
    backbone, report = _build(args)
    if report is not None:
        print(report.summary())
    print(format_summary(backbone))
    if args.json:
        _write_json({'model': args.model, 'checkpoint': args.checkpoint, **model_summary(backbone)}, args.json)
