"""PNG figures of the analysis results.

Figures are drawn on matplotlib's Agg canvas directly (no pyplot), so importing this module neither changes the
backend of an interactive session nor needs a display.
"""
import math
import os
import os.path as osp
from typing import Optional, Sequence, Tuple

import numpy as np
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from .attention_maps import AttentionMap
from .feature_collapse import FeatureCollapseResult
from .non_locality import NonLocalityResult


def _save(fig: Figure, path: str) -> str:
    os.makedirs(osp.dirname(osp.abspath(path)), exist_ok=True)
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=fig.dpi, format='png')
    return path


def _mark_stride_changes(ax, strides: Sequence[Tuple[int, int]]) -> None:
    """Dotted lines between layers of different stride (stage boundaries), with the stride on top."""
    starts = [0] + [i for i in range(1, len(strides)) if strides[i] != strides[i - 1]]
    for i in starts[1:]:
        ax.axvline(i - 0.5, color='0.6', linestyle=':', linewidth=1)
    if strides:
        ends = starts[1:] + [len(strides)]
        for s, e in zip(starts, ends):
            sy, sx = strides[s]
            label = f'stride {sy}' if sy == sx else f'stride {sy}x{sx}'
            ax.text((s + e - 1) / 2, 1.01, label, transform=ax.get_xaxis_transform(), ha='center', va='bottom',
                    fontsize=7, color='0.35')


def _layer_axis(ax, count: int) -> None:
    step = max(1, math.ceil(count / 24))
    ax.set_xticks(list(range(0, count, step)))
    ax.set_xlim(-0.5, count - 0.5)
    ax.set_xlabel('layer')


def plot_non_locality(result: NonLocalityResult, path: str, title: Optional[str] = None) -> str:
    """Layer on x, mean query-key distance (pixels) on y: one line per head index and the head mean."""
    fig = Figure(figsize=(8, 4.5), dpi=100)
    ax = fig.add_subplot(1, 1, 1)
    layers = result.layers
    max_heads = max(len(layer.heads) for layer in layers)
    # qualitative colours while they stay distinguishable, a sequential ramp for the 12-32 heads of deep stages
    colors = (colormaps['tab10'].colors[:max_heads] if max_heads <= 10 else
              [colormaps['viridis'](h / (max_heads - 1)) for h in range(max_heads)])
    for h in range(max_heads):
        xs = [i for i, layer in enumerate(layers) if h < len(layer.heads)]
        ys = [layers[i].heads[h] for i in xs]
        ax.plot(xs, ys, marker='o', markersize=3, linewidth=1, alpha=0.8, color=colors[h],
                label=f'head {h}' if max_heads <= 10 or h in (0, max_heads - 1) else None)
    ax.plot(range(len(layers)), [layer.mean for layer in layers], color='black', linewidth=2.2, label='mean')
    _mark_stride_changes(ax, [layer.stride for layer in layers])
    _layer_axis(ax, len(layers))
    ax.set_ylabel('attention distance (pixels)')
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2, loc='upper left', bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.set_title(title or f'Non-locality ({result.num_images} images, {result.image_size[0]}x'
                 f'{result.image_size[1]})', pad=14)
    fig.tight_layout()
    return _save(fig, path)


def plot_feature_collapse(result: FeatureCollapseResult, path: str, title: Optional[str] = None) -> str:
    """Layer on x, mean pairwise cosine similarity of the block's output tokens on y."""
    fig = Figure(figsize=(7, 4), dpi=100)
    ax = fig.add_subplot(1, 1, 1)
    ax.plot(range(len(result.names)), result.similarity, marker='o', markersize=4, color='tab:red')
    _layer_axis(ax, len(result.names))
    ax.set_ylabel('mean pairwise cosine similarity')
    ax.set_ylim(min(0.0, min(result.similarity) - 0.05), 1.05)
    ax.grid(alpha=0.3)
    ax.set_title(title or f'Feature collapse ({result.num_images} images, {result.image_size[0]}x'
                 f'{result.image_size[1]})')
    fig.tight_layout()
    return _save(fig, path)


def plot_attention_map(image: np.ndarray, attention: AttentionMap, path: str, max_columns: int = 6,
                       title: Optional[str] = None) -> str:
    """The image with the query marked, then the head-mean map (with several heads) and each head's map.

    ``image``: (H, W, 3) uint8 of the size the maps were computed at. Each panel's colour scale runs from 0 to
    that panel's maximum, so a head that spreads its attention is as visible as a peaked one.
    """
    maps = attention.maps.float().numpy()
    panels = [('image', None)] + ([('mean of heads', maps.mean(0))] if len(maps) > 1 else [])
    panels += [(f'head {h}', m) for h, m in enumerate(maps)]
    columns = min(max_columns, len(panels))
    rows = math.ceil(len(panels) / columns)
    fig = Figure(figsize=(2.4 * columns, 2.5 * rows + 0.4), dpi=100)
    qy, qx = attention.query
    for k, (label, values) in enumerate(panels):
        ax = fig.add_subplot(rows, columns, k + 1)
        ax.imshow(image)
        if values is not None:
            peak = float(values.max())
            ax.imshow(values, cmap='inferno', alpha=0.6, vmin=0.0, vmax=peak if peak > 0 else 1.0,
                      interpolation='nearest')
        ax.plot([qx], [qy], marker='+', color='cyan', markersize=10, markeredgewidth=2)
        ax.set_title(label, fontsize=8)
        ax.set_axis_off()
    fig.suptitle(title or f'layer {attention.index} ({attention.name}, {attention.kind} attention), query '
                 f'(y={qy:g}, x={qx:g})', fontsize=9)
    fig.tight_layout()
    return _save(fig, path)
