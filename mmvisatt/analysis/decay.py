"""Spatial-decay backbones (RMT, EVT): each head's decay mask around a query token, and the effective receptive
field (ERF) of a token.

The decay mask of head ``h`` for query ``q`` is ``gamma_h ** d(q, k)`` over the stage's grid, read from the biases
the stage itself builds for its attention (``stage.context``), so it shows exactly what the model applies:
Manhattan for RMT (the decomposed stages' row-then-column product is the same separable map), Euclidean inside
the query's group for EVT's EuSAg / EuSAd (zero outside it), Euclidean over the whole map for full attention.
The ERF is ``|d out[:, :, y, x] / d image|`` summed over channels (Luo et al., 2016), captured by a forward hook
on the stage, so the model is never edited.

    python tools/analysis/decay_masks.py RMT:t [CHECKPOINT] --stage 0 --size 224 --out-dir DIR
"""
import math
import os.path as osp
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn as nn
from matplotlib.figure import Figure
from mmengine.registry import MODELS
from torch import Tensor

from .cli import _parser, _write_json, run
from .inputs import backbone_config, build_backbone, image_size
from .plotting import _save

GRID_MODES = {'grouped', 'dilated', 'full'}


@dataclass
class DecayMasks:
    """``maps`` (heads, H, W): ``gamma_h ** d(query, token)`` (0 where the query does not attend); ``gammas`` per
    head; ``query`` (y, x) on the stage grid; ``kind`` of attention the mask belongs to."""
    maps: Tensor
    gammas: List[float]
    query: Tuple[int, int]
    stage: int
    kind: str


def _stage(model: nn.Module, index: int) -> nn.Module:
    stages = getattr(model, 'stages', None)
    if stages is None or not hasattr(stages[index], 'context') or not hasattr(stages[index], 'decay'):
        raise ValueError(f'{type(model).__name__} has no spatial-decay stages (RMT and EVT do)')
    return stages[index]


def stage_grid(image_hw: Sequence[int], stage: int) -> Tuple[int, int]:
    """The (H, W) token grid of stage ``stage`` (stride 2 ** (stage + 2)) for an image of ``image_hw`` pixels."""
    h, w = image_hw
    for _ in range(stage + 2):
        h, w = -(-h // 2), -(-w // 2)
    return h, w


@torch.no_grad()
def decay_masks(model: nn.Module, stage: int, grid: Sequence[int], query: Optional[Sequence[int]] = None,
                block: int = 0) -> DecayMasks:
    """Each head's decay mask of block ``block`` of stage ``stage`` on an (H, W) grid around ``query`` (default
    the grid centre)."""
    st = _stage(model, stage)
    H, W = grid
    qy, qx = (H // 2, W // 2) if query is None else query
    if not (0 <= qy < H and 0 <= qx < W):
        raise ValueError(f'query {(qy, qx)} is outside the {H}x{W} grid of stage {stage}')
    dtype = st.decay.log_gamma.dtype
    context = st.context(H, W, dtype)
    if isinstance(context, dict):  # EVT: one context per attention mode
        kind = st.modes[block]
        context = context[kind]
    else:
        kind = 'decomposed' if st.decomposed else 'full'
        context = context[2] if st.decomposed else context[2:]  # (sin, cos, bias)
    heads = st.decay.log_gamma.numel()
    q = qy * W + qx
    if kind == 'decomposed':
        bias_h, bias_w = context
        maps = bias_h[:, qy, :].exp()[:, :, None] * bias_w[:, qx, :].exp()[:, None, :]
    elif kind == 'full':
        maps = context[0][:, q].exp().view(heads, H, W)
    else:
        bias, groups = context
        pos = int(groups.inverse[q])
        g, slot = divmod(pos, groups.group_size)
        members = groups.order[g * groups.group_size:(g + 1) * groups.group_size]
        weights = bias[:, g, slot].exp() * groups.valid[g]
        maps = torch.zeros(heads, H * W, dtype=weights.dtype, device=weights.device)
        keep = members < H * W
        maps[:, members[keep]] = weights[:, keep]
        maps = maps.view(heads, H, W)
    return DecayMasks(maps.float().cpu(), st.decay.log_gamma.exp().tolist(), (qy, qx), stage, kind)


def effective_receptive_field(model: nn.Module, stage: int, images: Tensor,
                              query: Optional[Sequence[int]] = None) -> Tuple[Tensor, Tuple[int, int]]:
    """``|d stage_output[:, :, y, x] / d images|`` summed over channels and the batch: (H_img, W_img), and the
    query (y, x) on the stage grid (default its centre)."""
    st = _stage(model, stage)
    captured = {}

    def capture(module, args, out):
        captured['out'] = out[0]  # (stage output, downsampled map)

    handle = st.register_forward_hook(capture)
    images = images.detach().clone().requires_grad_(True)
    try:
        model(images)
    finally:
        handle.remove()
    out = captured['out']  # (B, H, W, C)
    H, W = out.shape[1:3]
    qy, qx = (H // 2, W // 2) if query is None else query
    if not (0 <= qy < H and 0 <= qx < W):
        raise ValueError(f'query {(qy, qx)} is outside the {H}x{W} grid of stage {stage}')
    (grad, ) = torch.autograd.grad(out[:, qy, qx].sum(), images)
    return grad.abs().sum(dim=(0, 1)).cpu(), (qy, qx)


def plot_decay_masks(masks: DecayMasks, path: str, max_columns: int = 6, title: Optional[str] = None) -> str:
    """One panel per head: ``gamma ** d`` on the stage grid (0 to 1), the query marked."""
    maps = masks.maps.numpy()
    heads = len(maps)
    columns = min(max_columns, heads)
    rows = math.ceil(heads / columns)
    fig = Figure(figsize=(2.4 * columns, 2.4 * rows + 0.5), dpi=100)
    qy, qx = masks.query
    for h in range(heads):
        ax = fig.add_subplot(rows, columns, h + 1)
        ax.imshow(maps[h], cmap='viridis', vmin=0.0, vmax=1.0, interpolation='nearest')
        ax.plot([qx], [qy], marker='+', color='red', markersize=8, markeredgewidth=2)
        ax.set_title(f'head {h}, gamma {masks.gammas[h]:.4f}', fontsize=8)
        ax.set_axis_off()
    fig.suptitle(title or f'decay masks, stage {masks.stage} ({masks.kind} attention), query (y={qy}, x={qx})',
                 fontsize=9)
    fig.tight_layout()
    return _save(fig, path)


def plot_effective_receptive_field(erf: Tensor, path: str, query: Tuple[int, int], stage: int,
                                   title: Optional[str] = None) -> str:
    """The ERF on the input grid, log-scaled (it spans orders of magnitude), the query's pixel centre marked."""
    values = np.log10(erf.float().numpy() + 1e-12)
    fig = Figure(figsize=(5, 4.6), dpi=100)
    ax = fig.add_subplot(1, 1, 1)
    image = ax.imshow(values, cmap='magma', vmin=values.max() - 4, vmax=values.max(), interpolation='nearest')
    stride = 2 ** (stage + 2)
    ax.plot([(query[1] + 0.5) * stride], [(query[0] + 0.5) * stride], marker='+', color='cyan', markersize=10,
            markeredgewidth=2)
    fig.colorbar(image, ax=ax, fraction=0.046, label='log10 |gradient|')
    ax.set_title(title or f'effective receptive field, stage {stage} token (y={query[0]}, x={query[1]})',
                 fontsize=9)
    fig.tight_layout()
    return _save(fig, path)


def decay_masks_main(argv: Optional[Sequence[str]] = None) -> None:
    parser = _parser('Per-head decay masks and the effective receptive field of a token (RMT, EVT).',
                     images=False)
    parser.add_argument('--stage', type=int, default=0, help='stage (0-3) whose masks and token are shown')
    parser.add_argument('--block', type=int, default=0,
                        help='block of the stage (EVT alternates grouped / dilated blocks)')
    parser.add_argument('--size', type=int, nargs='+', default=[224], metavar='N',
                        help='input size N x N (or H W) in pixels; the stage grid follows from it')
    parser.add_argument('--query', type=int, nargs=2, metavar=('Y', 'X'),
                        help='token on the stage grid (default its centre)')
    parser.add_argument('--no-erf', action='store_true', help='skip the receptive field (a backward pass)')
    parser.add_argument('--out-dir', default='work_dirs/analysis/decay', help='where PNGs and JSON go')
    args = parser.parse_args(argv)
    import mmvisatt.models  # noqa: F401  (registers the backbones: the checkpoint family is the class's)
    if args.family is None and args.checkpoint.lower() != 'none':
        cls = MODELS.get(backbone_config(args.model, args.backbone_options)[0]['type'])
        args.family = getattr(cls, '_family', None) or None
    backbone, _ = build_backbone(args.model, args.checkpoint, family=args.family, options=args.backbone_options,
                                 seed=args.seed)
    size = image_size(args.size)
    grid = stage_grid(size, args.stage)
    masks = decay_masks(backbone, args.stage, grid, args.query, args.block)
    written = [plot_decay_masks(masks, osp.join(args.out_dir, f'decay_masks_stage{args.stage}.png'))]
    summary = dict(model=args.model, checkpoint=args.checkpoint, stage=args.stage, grid=list(grid),
                   query=list(masks.query), kind=masks.kind, gammas=masks.gammas)
    if not args.no_erf:
        torch.manual_seed(args.seed)
        erf, query = effective_receptive_field(backbone, args.stage, torch.randn(1, 3, *size), masks.query)
        written.append(plot_effective_receptive_field(erf, osp.join(args.out_dir, f'erf_stage{args.stage}.png'),
                                                      query, args.stage))
    _write_json(summary, osp.join(args.out_dir, 'decay_masks.json'))
    for path in written:
        print(path)


def main() -> None:
    run(decay_masks_main)
