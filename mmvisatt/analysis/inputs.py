"""What the analysis tools run on: a backbone (from a config or a ``Type:arch`` spec, plus a checkpoint) and a
folder of images resized and normalised as for ImageNet-pretrained backbones."""
import os.path as osp
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.nn as nn
from mmengine.config import Config
from mmengine.registry import MODELS, DefaultScope
from PIL import Image
from torch import Tensor

from mmvisatt.checkpoint import LoadReport, load_pretrained

# mmpretrain/mmdet data preprocessor defaults, in 0-255 pixel units
IMAGENET_MEAN = (123.675, 116.28, 103.53)
IMAGENET_STD = (58.395, 57.12, 57.375)
IMAGE_SUFFIXES = ('.png', '.jpg', '.jpeg', '.bmp', '.tif', '.tiff', '.webp')

# Checkpoint family each backbone's ``init_weights`` passes to ``load_pretrained``.
CHECKPOINT_FAMILIES = {'ReSwinTransformer': 'reswin', 'ReViT': 'revit', 'ReMViTv2': 'remvit'}


@dataclass
class ImageBatch:
    """``tensor`` (N, 3, H, W) normalised; ``pixels`` the resized RGB images (H, W, 3) uint8; ``paths``."""
    tensor: Tensor
    pixels: List[np.ndarray]
    paths: List[str]


def image_size(size: Union[int, Sequence[int]]) -> Tuple[int, int]:
    """``224`` or ``(h, w)`` -> (h, w)."""
    if isinstance(size, int):
        return size, size
    size = tuple(int(s) for s in size)
    if len(size) == 1:
        return size[0], size[0]
    if len(size) != 2:
        raise ValueError(f'size must be one or two integers (height, width), got {size}')
    return size


def list_images(image_dir: str, max_images: Optional[int] = None) -> List[str]:
    folder = Path(image_dir)
    if not folder.is_dir():
        raise FileNotFoundError(f"Image folder '{image_dir}' does not exist. The generated demo images work: "
                                f"python -c 'from mmvisatt.datasets import prepare_demo_coco; "
                                f"print(prepare_demo_coco())' prints a root whose val/ folder holds PNGs.")
    paths = sorted(str(p) for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not paths:
        raise FileNotFoundError(f"No images ({', '.join(IMAGE_SUFFIXES)}) in '{image_dir}'.")
    return paths[:max_images] if max_images else paths


def load_images(image_dir: str, size: Union[int, Sequence[int]] = 224,
                max_images: Optional[int] = None) -> ImageBatch:
    """Read the images of a folder (sorted by name), resize to ``size`` (bilinear) and normalise them."""
    height, width = image_size(size)
    paths = list_images(image_dir, max_images)
    pixels = [np.asarray(Image.open(p).convert('RGB').resize((width, height), Image.BILINEAR)) for p in paths]
    tensor = torch.from_numpy(np.stack(pixels)).permute(0, 3, 1, 2).float()
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    return ImageBatch((tensor - mean) / std, pixels, paths)


def batches(images: Tensor, batch_size: int, model: nn.Module) -> Iterator[Tensor]:
    """Slices of ``images`` on the device of ``model``."""
    if batch_size < 1:
        raise ValueError(f'batch_size must be at least 1, got {batch_size}')
    device = next(model.parameters()).device
    for start in range(0, images.shape[0], batch_size):
        yield images[start:start + batch_size].to(device)


def captured_passes(model: nn.Module, capture, images: Tensor, batch_size: int) -> Iterator[None]:
    """Run ``model`` on each batch of ``images`` with ``capture`` (a capture context, entered) cleared before
    every pass; yields once after each pass, when the capture holds that batch's records."""
    for batch in batches(images, batch_size, model):
        capture.clear()
        model(batch)
        yield


def backbone_config(model: str, options: Optional[Dict] = None) -> Tuple[dict, Optional[str]]:
    """The backbone dict of a config file (``model.backbone``) or of a spec ``Type[:arch]``; and the config's
    ``default_scope``. ``options`` are merged into the backbone dict."""
    if osp.isfile(model):
        cfg = Config.fromfile(model)
        backbone = cfg.get('model', {}).get('backbone')
        if backbone is None:
            raise ValueError(f'{model} has no model.backbone to analyse.')
        backbone, scope = backbone.to_dict(), cfg.get('default_scope')
    elif model.endswith('.py'):
        raise FileNotFoundError(f"Config file '{model}' does not exist.")
    else:
        kind, _, arch = model.partition(':')
        backbone, scope = dict(type=kind), None
        if arch:
            backbone['arch'] = arch
    backbone.update(options or {})
    return backbone, scope


def build_backbone(model: str, checkpoint: Optional[str] = None, *, family: Optional[str] = None,
                   options: Optional[Dict] = None, seed: int = 0) -> Tuple[nn.Module, Optional[LoadReport]]:
    """Build the backbone of a config file or spec in eval mode, randomly initialised (``seed``) and then loaded
    from ``checkpoint`` (any layout :func:`~mmvisatt.checkpoint.load_pretrained` supports; None or ``'none'``
    keeps the random weights). ``family`` overrides the checkpoint family chosen from the backbone type."""
    import mmvisatt.models  # noqa: F401  (registers the backbones and their checkpoint converters)
    cfg, scope = backbone_config(model, options)
    # The checkpoint comes from the command line; a Pretrained init_cfg in the config may point at a missing file.
    cfg['init_cfg'] = None
    # Attention maps are read from the score maps a block carries on: a config's memory strategy (scores handed on
    # shrunk or as factors, the same values) would leave none to read.
    if cfg.get('score_memory', 'full') != 'full':
        cfg['score_memory'] = 'full'
    torch.manual_seed(seed)
    if MODELS.get(cfg['type']) is not None:
        backbone = MODELS.build(cfg)
    else:
        with DefaultScope.overwrite_default_scope(scope):
            backbone = MODELS.build(cfg)
    backbone.init_weights()
    report = None
    if checkpoint and checkpoint.lower() != 'none':
        name = type(backbone).__name__
        family = family or CHECKPOINT_FAMILIES.get(name)
        if family is None:
            raise ValueError(f'No checkpoint family is known for {name}; pass --family.')
        report = load_pretrained(backbone, checkpoint, family=family,
                                 allow_missing=getattr(backbone, 'not_in_pretrained', ()))
    # some backbones' train() (mmpretrain's ResNet) return None instead of the module
    backbone.eval()
    return backbone, report
