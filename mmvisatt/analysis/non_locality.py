"""Non-locality of attention (ReViT eq. 11/12; the "mean attention distance" of the ViT paper).

For layer l and head h, ``NL_{l,h} = mean_q sum_k A_{l,h}(q, k) * ||p_q - p_k||``: how far, in input pixels, a
query looks on average. Positions are token centres in pixels (see :mod:`.capture`), so layers of different
strides and the query and key grids of pooling attention are measured in the same unit. Padded window slots are
neither queries nor keys. The mean runs over the real queries of an image, then over images.
"""
from dataclasses import dataclass, field
from typing import Dict, List, Tuple

import torch
import torch.nn as nn
from torch import Tensor

from .capture import AttentionCapture, AttentionRecord, PooledAttentionRecord, WindowAttentionRecord
from .inputs import captured_passes


def pooled_non_locality(probs: Tensor, q_centres: Tensor, k_centres: Tensor) -> Tensor:
    """(B, heads, Nq, Nk) probabilities, (Nq, 2) and (Nk, 2) pixel centres -> (B, heads) mean distance."""
    distance = torch.cdist(q_centres.to(probs.dtype), k_centres.to(probs.dtype))
    return (probs * distance).sum(-1).mean(-1)


def window_non_locality(probs: Tensor, centres: Tensor, real: Tensor) -> Tensor:
    """(B * num_windows, heads, N, N) probabilities, (num_windows, N, 2) slot centres and (num_windows, N)
    real-token flags -> (B, heads) mean distance over the real queries of each image."""
    num_windows = centres.shape[0]
    centres = centres.to(probs.dtype)
    distance = torch.cdist(centres, centres) * real[:, None, :]  # padded keys do not count
    per_query = (probs.unflatten(0, (-1, num_windows)) * distance[None, :, None]).sum(-1)  # (B, nW, h, N)
    weights = real.to(probs.dtype)[None, :, None]
    return (per_query * weights).sum(dim=(1, 3)) / weights.sum()


def record_non_locality(record: AttentionRecord) -> Tensor:
    """(B, heads) non-locality of one captured layer."""
    if isinstance(record, WindowAttentionRecord):
        centres, real = record.token_centres()
        return window_non_locality(record.probabilities(), centres, real)
    if isinstance(record, PooledAttentionRecord):
        return pooled_non_locality(record.probabilities(), record.query_centres(), record.key_centres())
    raise TypeError(f'no non-locality for a {type(record).__name__}')


@dataclass
class LayerNonLocality:
    """Non-locality of one layer: per head and their mean, in pixels; ``stride`` is the query token size."""
    name: str
    kind: str
    stride: Tuple[int, int]
    heads: List[float]

    @property
    def mean(self) -> float:
        return sum(self.heads) / len(self.heads)


@dataclass
class NonLocalityResult:
    layers: List[LayerNonLocality] = field(default_factory=list)
    num_images: int = 0
    image_size: Tuple[int, int] = (0, 0)

    def to_dict(self) -> Dict:
        return dict(metric='non_locality', unit='pixels', num_images=self.num_images,
                    image_size=list(self.image_size),
                    layers=[dict(index=i, name=layer.name, kind=layer.kind, stride=list(layer.stride),
                                 heads=layer.heads, mean=layer.mean) for i, layer in enumerate(self.layers)])


@torch.no_grad()
def non_locality(model: nn.Module, images: Tensor, batch_size: int = 4) -> NonLocalityResult:
    """Per-layer, per-head non-locality of ``model`` over ``images`` (N, 3, H, W, normalised).

    Raises :class:`~mmvisatt.analysis.capture.UnsupportedModelError` for a model without supported attention.
    """
    model.eval()
    sums: Dict[str, Tensor] = {}
    meta: Dict[str, AttentionRecord] = {}
    with AttentionCapture(model) as capture:
        for _ in captured_passes(model, capture, images, batch_size):
            for record in capture.records:
                values = record_non_locality(record).sum(0).double().cpu()
                sums[record.name] = sums[record.name] + values if record.name in sums else values
                meta.setdefault(record.name, record)
    layers = [LayerNonLocality(name, meta[name].kind, tuple(meta[name].stride),
                               (sums[name] / images.shape[0]).tolist()) for name in sums]
    return NonLocalityResult(layers, images.shape[0], tuple(images.shape[-2:]))
