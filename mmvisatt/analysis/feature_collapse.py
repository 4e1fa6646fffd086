"""Feature collapse: how alike the tokens of a layer become with depth (the over-smoothing ReViT counters).

For each block output (the token map after attention and MLP) the mean cosine similarity over all pairs of
distinct tokens of an image, averaged over images: 1 when every token points the same way, 0 for mutually
orthogonal tokens.
"""
from dataclasses import dataclass, field
from typing import Dict, List, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from .capture import BlockOutputCapture
from .inputs import captured_passes


def mean_pairwise_cosine(tokens: Tensor) -> Tensor:
    """(B, N, C) or (B, H, W, C) tokens -> (B,) mean cosine similarity over the N * (N - 1) ordered pairs i != j.

    Uses ``sum_{i != j} <u_i, u_j> = ||sum_i u_i||^2 - sum_i ||u_i||^2`` for the unit vectors u, so the cost is
    linear in N. Zero tokens count as similarity 0 with everything.
    """
    tokens = tokens.flatten(1, -2) if tokens.dim() == 4 else tokens
    if tokens.dim() != 3:
        raise ValueError(f'expected (B, N, C) or (B, H, W, C) tokens, got shape {tuple(tokens.shape)}')
    n = tokens.shape[1]
    if n < 2:
        raise ValueError('pairwise similarity needs at least two tokens')
    unit = F.normalize(tokens.double(), dim=-1)
    total = unit.sum(1).pow(2).sum(-1) - unit.pow(2).sum(dim=(1, 2))
    return total / (n * (n - 1))


@dataclass
class FeatureCollapseResult:
    """Mean pairwise cosine similarity of each block's output tokens, in block order."""
    names: List[str] = field(default_factory=list)
    similarity: List[float] = field(default_factory=list)
    num_tokens: List[int] = field(default_factory=list)
    num_images: int = 0
    image_size: Tuple[int, int] = (0, 0)

    def to_dict(self) -> Dict:
        return dict(metric='mean_pairwise_cosine_similarity', num_images=self.num_images,
                    image_size=list(self.image_size),
                    layers=[dict(index=i, name=n, similarity=s, num_tokens=t)
                            for i, (n, s, t) in enumerate(zip(self.names, self.similarity, self.num_tokens))])


@torch.no_grad()
def feature_collapse(model: nn.Module, images: Tensor, batch_size: int = 4) -> FeatureCollapseResult:
    """Per-block token similarity of ``model`` over ``images`` (N, 3, H, W, normalised)."""
    model.eval()
    sums: Dict[str, float] = {}
    tokens: Dict[str, int] = {}
    with BlockOutputCapture(model) as capture:
        for _ in captured_passes(model, capture, images, batch_size):
            for name, output in capture.outputs:
                sums[name] = sums.get(name, 0.0) + mean_pairwise_cosine(output).sum().item()
                tokens[name] = output[0, ..., 0].numel()
    names = list(sums)
    return FeatureCollapseResult(names, [sums[n] / images.shape[0] for n in names], [tokens[n] for n in names],
                                 images.shape[0], tuple(images.shape[-2:]))
