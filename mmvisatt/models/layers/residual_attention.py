"""Residual attention (ReViT): pre-softmax scores carried from layer to layer.

Layer l attends with ``S_l = alpha * (q k^T / sqrt(d) + B) + (1 - alpha) * S_{l-1}`` where ``S_{l-1}`` is the
previous layer's *mixed* score tensor, so the carried state is a moving average over depth. The formula needs
``S_{l-1}`` expressed on the token pairs of layer l. For window attention the pairs change from layer to layer
(windows shift, stages merge patches and change the head count); this module holds the two ways of aligning them:

* :func:`align_by_slot` reproduces the official ReSwin code: the previous tensor is treated as a flat list of
  (window, head) slots and resized with nearest interpolation, ignoring where the windows are.
* :func:`align_by_position` aligns by image position: every current score (query p, key q) takes the previous
  score of the same pair of positions (averaged over the 2x2 children of each token after patch merging, and
  over heads when their number changes). Pairs the previous layer never scored (they sat in different windows)
  keep the plain current score. See ``docs/residual_attention.md`` for the reasoning.
"""
from functools import lru_cache
from typing import NamedTuple, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from .window import WindowGrid, window_slot_of, window_token_coords


class WindowScores(NamedTuple):
    """Mixed pre-mask scores of one window-attention layer, with the partition they were computed on.

    ``scores``: (B * num_windows, heads, N, N).
    """
    scores: Tensor
    grid: WindowGrid


def align_by_slot(prev: WindowScores, grid: WindowGrid, batch: int, num_heads: int) -> Tuple[Tensor, None]:
    """The official ReSwin alignment: nearest resize over the flattened (window, head) slots of each image."""
    N = grid.window_area
    slots = prev.scores.reshape(batch, -1, N, N)
    # The official code calls F.interpolate(size=...) on the scores; asking it for the source index of each slot
    # once gives the identical selection as a gather, whose backward is far cheaper.
    index = F.interpolate(torch.arange(slots.shape[1], dtype=torch.float64).view(1, 1, -1, 1, 1),
                          size=(grid.num_windows * num_heads, 1, 1)).view(-1).long().to(slots.device)
    aligned = slots.index_select(1, index)
    return aligned.reshape(batch * grid.num_windows, num_heads, N, N), None


# Blocks of a stage alternate between two partitions and batches mostly repeat their padded size, so a few
# cached maps serve most calls; int32 indices halve their memory (about 15 MB per map at 800x1333 input).
@lru_cache(maxsize=8)
def _pair_sources(prev: WindowGrid, cur: WindowGrid, device: torch.device) -> Tuple[Tensor, Tensor]:
    """For every current (window, query, key) slot, where its pair of positions sits in ``prev``'s scores.

    Returns ``index`` (K, L) into the flattened previous (window, query, key) axis and ``valid`` (K, L), with
    L = num_windows * N * N and K the number of fine-position pairs a current pair stands for (1 within a
    stage, 16 after a 2x patch merging).
    """
    if (prev.height, prev.width) == (cur.height, cur.width):
        factor = 1
    elif (-(-prev.height // 2), -(-prev.width // 2)) == (cur.height, cur.width):
        factor = 2
    else:
        raise ValueError(f'Cannot align residual scores from a {prev.height}x{prev.width} map to a '
                         f'{cur.height}x{cur.width} map: only equal sizes or a 2x patch merging are supported.')
    ys, xs = window_token_coords(cur, device)  # (num_windows, N) each
    offsets = torch.arange(factor, device=device)
    # children of each current token on the previous (finer) map: (num_windows, N, factor * factor)
    child_y = (ys[..., None, None] * factor + offsets[:, None]).expand(*ys.shape, factor, factor).flatten(-2)
    child_x = (xs[..., None, None] * factor + offsets[None, :]).expand(*xs.shape, factor, factor).flatten(-2)
    real = (child_y < prev.height) & (child_x < prev.width)
    window, slot = window_slot_of(child_y, child_x, prev)

    N = cur.window_area
    Np = prev.window_area
    # pair every child of the query with every child of the key: (num_windows, N, N, K)
    q_win, k_win = window[:, :, None, :, None], window[:, None, :, None, :]
    q_slot, k_slot = slot[:, :, None, :, None], slot[:, None, :, None, :]
    valid = (q_win == k_win) & real[:, :, None, :, None] & real[:, None, :, None, :]
    index = (q_win * Np + q_slot) * Np + k_slot
    K = factor ** 4
    index = index.reshape(-1, N, N, K)
    valid = valid.reshape(-1, N, N, K)
    index = torch.where(valid, index, torch.zeros_like(index)).to(torch.int32)
    return index.reshape(-1, K).t().contiguous(), valid.reshape(-1, K).t().contiguous()


def align_by_position(prev: WindowScores, grid: WindowGrid, batch: int,
                      num_heads: int) -> Tuple[Tensor, Tensor]:
    """Align previous scores to the current partition by image position.

    Returns ``aligned`` (B * num_windows, heads or 1, N, N) and ``valid`` (num_windows, N, N): False where the
    previous layer scored none of the position pairs (the current score is then used unchanged).
    """
    N = grid.window_area
    prev_heads = prev.scores.shape[1]
    scores = prev.scores.reshape(batch, -1, prev_heads, prev.grid.window_area ** 2)
    if prev_heads != num_heads:
        # Heads of different widths have no one-to-one correspondence; their mean broadcasts to all new heads.
        scores = scores.mean(dim=2, keepdim=True)
    scores = scores.transpose(1, 2).flatten(2)  # (B, h, prev_windows * Np * Np)
    index, valid = _pair_sources(prev.grid, grid, scores.device)
    total = scores.new_zeros(scores.shape[0], scores.shape[1], index.shape[1])
    for k in range(index.shape[0]):  # a loop keeps peak memory at one gather
        total = total + scores[:, :, index[k]] * valid[k]
    count = valid.sum(0)
    aligned = total / count.clamp(min=1)
    aligned = aligned.reshape(batch, -1, grid.num_windows, N, N).transpose(1, 2)
    return aligned.reshape(batch * grid.num_windows, -1, N, N), (count > 0).reshape(grid.num_windows, N, N)


def mix_scores(scores: Tensor, residual: Optional[Tensor], valid: Optional[Tensor],
               alpha: Union[Tensor, float], num_windows: int) -> Tensor:
    """``alpha * scores + (1 - alpha) * residual`` where the residual is valid, ``scores`` elsewhere.

    ``scores`` (B * num_windows, heads, N, N); ``valid`` (num_windows, N, N) or None for all-valid.
    """
    if residual is None:
        return scores
    mixed = alpha * scores + (1 - alpha) * residual
    if valid is None:
        return mixed
    B = scores.shape[0] // num_windows
    mixed = torch.where(valid[None, :, None], mixed.unflatten(0, (B, num_windows)),
                        scores.unflatten(0, (B, num_windows)))
    return mixed.flatten(0, 1)


ALIGNERS = {'official': align_by_slot, 'aligned': align_by_position}
