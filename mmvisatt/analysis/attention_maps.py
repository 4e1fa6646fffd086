"""Where one query looks: the attention row of a chosen query position, laid out on the input image.

The query is a pixel position; the query token is the one whose cell contains it. Each key's probability is
painted over the pixels of the key token's cell, so a map shows the attention at its true place and size: the
window of a window-attention layer (with the tokens a shifted window wraps around to), the whole image for
global attention, the coarse key grid of pooling attention. Padded window slots are dropped.
"""
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
from torch import Tensor

from mmvisatt.models.layers.window import window_slot_of, window_token_coords

from .capture import AttentionCapture, AttentionRecord, PooledAttentionRecord, WindowAttentionRecord
from .inputs import batches

Pair = Tuple[int, int]
LayerKey = Union[int, str]


def _token_index(position: float, stride: int, size: int) -> int:
    return min(max(int(position // stride), 0), size - 1)


def _paint(values: Tensor, stride: Pair, image_size: Pair) -> Tensor:
    """(heads, h, w) per-token values -> (heads, H, W) per-pixel, each token over its stride x stride cell."""
    pixels = values.repeat_interleave(stride[0], dim=-2).repeat_interleave(stride[1], dim=-1)
    out = values.new_zeros(values.shape[0], *image_size)
    h, w = min(image_size[0], pixels.shape[-2]), min(image_size[1], pixels.shape[-1])
    out[:, :h, :w] = pixels[:, :h, :w]
    return out


def query_attention(record: AttentionRecord, query: Tuple[float, float], image_index: int = 0) -> Tuple[Tensor, Pair]:
    """The attention row of the query at pixel ``query`` (y, x) of image ``image_index``, on the key token map.

    Returns (heads, Hk, Wk) probabilities (zero outside the query's window for window attention) and the pixel
    stride of that key map.
    """
    if isinstance(record, WindowAttentionRecord):
        grid = record.grid
        fy = _token_index(query[0], record.stride[0], grid.height)
        fx = _token_index(query[1], record.stride[1], grid.width)
        window, slot = window_slot_of(torch.tensor(fy), torch.tensor(fx), grid)
        window, slot = int(window), int(slot)
        probs = record.probabilities()[image_index * grid.num_windows + window, :, slot]  # (heads, N)
        ys, xs = window_token_coords(grid, probs.device)[:, window]
        keys = probs.new_zeros(probs.shape[0], grid.padded_h, grid.padded_w)
        keys[:, ys, xs] = probs
        return keys[:, :grid.height, :grid.width], record.stride
    if isinstance(record, PooledAttentionRecord):
        q, kv = record.q_grid, record.kv_grid
        qy = _token_index(query[0], record.q_stride[0], q.height)
        qx = _token_index(query[1], record.q_stride[1], q.width)
        probs = record.probabilities()[image_index, :, qy * q.width + qx]
        return probs.reshape(-1, kv.height, kv.width), record.kv_stride
    raise TypeError(f'no attention map for a {type(record).__name__}')


def attention_map(record: AttentionRecord, query: Tuple[float, float], image_size: Pair,
                  image_index: int = 0) -> Tensor:
    """(heads, H, W) attention of the query at pixel ``query`` (y, x), painted over an ``image_size`` image."""
    keys, stride = query_attention(record, query, image_index)
    return _paint(keys, stride, image_size)


@dataclass
class AttentionMap:
    """``maps`` (heads, H, W) for the query at pixel ``query`` (y, x) of image ``image_index`` in layer ``index``."""
    index: int
    name: str
    kind: str
    image_index: int
    query: Tuple[float, float]
    maps: Tensor


def default_layers(records: Sequence[AttentionRecord]) -> List[int]:
    """The first layer and the last layer of every run of equal stride (the end of each stage)."""
    chosen = [0]
    for i, record in enumerate(records):
        if i + 1 == len(records) or tuple(records[i + 1].stride) != tuple(record.stride):
            chosen.append(i)
    return sorted(set(chosen))


def resolve_layers(records: Sequence[AttentionRecord], layers: Optional[Sequence[LayerKey]]) -> List[int]:
    """Layer indices for ``layers`` given as indices (negative from the end), block names, or None (defaults)."""
    if layers is None:
        return default_layers(records)
    names = [r.name for r in records]
    chosen = []
    for key in layers:
        if isinstance(key, str) and not key.lstrip('-').isdigit():
            if key not in names:
                raise ValueError(f"No attention layer named '{key}'; layers are {', '.join(names)}")
            chosen.append(names.index(key))
            continue
        index = int(key)
        if not -len(records) <= index < len(records):
            raise ValueError(f'Layer index {index} out of range: the model has {len(records)} attention layers')
        chosen.append(index % len(records))
    return sorted(set(chosen))


@torch.no_grad()
def attention_maps(model: nn.Module, images: Tensor, layers: Optional[Sequence[LayerKey]] = None,
                   query: Optional[Tuple[float, float]] = None, batch_size: int = 4) -> List[AttentionMap]:
    """Attention maps of the chosen layers for every image of ``images`` (N, 3, H, W, normalised).

    ``query`` is a pixel position (y, x), default the image centre; ``layers`` as in :func:`resolve_layers`.
    """
    model.eval()
    size = tuple(images.shape[-2:])
    query = (size[0] / 2, size[1] / 2) if query is None else tuple(float(q) for q in query)
    if not (0 <= query[0] < size[0] and 0 <= query[1] < size[1]):
        raise ValueError(f'query {query} lies outside the {size[0]}x{size[1]} image')
    out: List[AttentionMap] = []
    chosen: Optional[List[int]] = None
    start = 0
    with AttentionCapture(model) as capture:
        for batch in batches(images, batch_size, model):
            capture.clear()
            model(batch)
            records = capture.records
            chosen = resolve_layers(records, layers) if chosen is None else chosen
            for b in range(batch.shape[0]):
                for i in chosen:
                    record = records[i]
                    out.append(AttentionMap(i, record.name, record.kind, start + b, query,
                                            attention_map(record, query, size, b).cpu()))
            start += batch.shape[0]
    return out
