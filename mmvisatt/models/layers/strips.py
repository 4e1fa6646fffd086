"""Row strips: inference of a wide, token-wise MLP with same-size convolutions inside, a band of rows at a time.

The FFNs of the convolutional attention families widen every token 3-4x and convolve the wide map. At detection
sizes that map is tens of MB (RMT/EVT-T's first stage at 800x1216: 47 MB). The CPU allocator serves blocks that
large with fresh pages, so every call pays to fault the whole map in, and the passes over it (projection,
activation, convolution, projection) each stream it through memory. Built a few rows at a time, with the halo
rows the convolutions need, each strip stays in cache and its blocks are reused; the results are the same numbers,
since every row of every strip sees exactly the inputs it sees in one pass. A backward would keep every strip's
activations anyway, so strips are for inference only.
"""
from typing import Iterator, Optional, Tuple

import torch
from torch import Tensor

# Wide maps up to this size are built in one pass (at 800x1216 RMT/EVT-T's third stage, 12 MB, is faster so).
SPLIT_BYTES = 16 << 20
# Target size of one strip's wide map; strips have at least MIN_ROWS rows, so the halo rows stay a small overhead.
STRIP_BYTES = 4 << 20
MIN_ROWS = 16


def strip_rows(x: Tensor, height: int, row_elements: int) -> Optional[int]:
    """Rows per strip for a wide map of ``height`` rows of ``row_elements`` elements of ``x``'s dtype, or None for
    one pass: always outside CPU inference (an autograd graph to record, or autocast, since the strips write into
    a preallocated output of the input's dtype). GPUs keep freed blocks in PyTorch's caching allocator, so there a
    whole map costs no faults and strips would only add kernel launches."""
    if x.device.type != 'cpu' or torch.is_grad_enabled() or torch.is_autocast_enabled('cpu'):
        return None
    row_bytes = row_elements * x.element_size()
    if height * row_bytes <= SPLIT_BYTES:
        return None
    rows = max(MIN_ROWS, STRIP_BYTES // max(row_bytes, 1))
    return rows if rows < height else None


def row_strips(height: int, rows: int, halo: int) -> Iterator[Tuple[int, int, int, int]]:
    """(first, end, halo_first, halo_end) of each strip: the rows it produces and the rows it reads."""
    for first in range(0, height, rows):
        end = min(first + rows, height)
        yield first, end, max(first - halo, 0), min(end + halo, height)
