"""Key renames that several families' converters share (the checkpoint layouts of Swin, ViT and MViTv2 releases).

Each is a pure function of one key, so a converter reads as the list of renames its layout needs.
"""
import re
from typing import Callable, Dict, Mapping

from torch import Tensor

# buffers Swin-style checkpoints carry that the model rebuilds from its sizes
REBUILT_BUFFERS = ('relative_position_index', 'attn_mask')


def is_rebuilt_buffer(key: str) -> bool:
    return key.endswith(REBUILT_BUFFERS)


def head_key(key: str) -> str:
    """A classifier head's key in any release layout (``head.*``, ``head.projection.*``, ``head.fc.*``) -> the
    key of mmpretrain's ``LinearClsHead`` (``head.fc.*``)."""
    return 'head.fc.' + key.split('.')[-1]


def final_norm_key(key: str, index: int) -> str:
    """The final ``norm.*`` of a release -> ``norm{index}.*``, the output norm of the last stage that loads it."""
    return re.sub(r'^norm\.', f'norm{index}.', key)


def swin_layer_key(key: str, merging_at_end: bool) -> str:
    """A Swin ``layers.{i}.*`` key -> ``stages.{i}.*``. Patch merging ends layer i in the official Swin layout
    (``merging_at_end``) and opens stage i + 1 here, as in timm's layout."""
    m = re.match(r'layers\.(\d+)\.downsample\.(.*)', key)
    if m:
        return f'stages.{int(m.group(1)) + int(merging_at_end)}.downsample.{m.group(2)}'
    return re.sub(r'^layers\.', 'stages.', key)


def rename_release(state_dict: Mapping[str, Tensor], backbone_key: Callable[[str], str]) -> Dict[str, Tensor]:
    """A release file -> mm-style keys: the classifier head to ``head.fc.*`` (:func:`head_key`), the buffers the
    model rebuilds dropped, every other key to ``'backbone.' + backbone_key(key)``."""
    out = {}
    for key, value in state_dict.items():
        if is_rebuilt_buffer(key):
            continue
        out[head_key(key) if key.startswith('head.') else 'backbone.' + backbone_key(key)] = value
    return out
