"""Full-grid decayed attention two ways, measured side by side: the decay-mask path the models run, and
FlexAttention with a ``score_mod`` that never builds the mask.

RMT's full-attention stages (RMT-T's stages 3-4) and EVT's last stage bias every query/key pair by
``log(gamma_h) * d(n, m)`` (:mod:`mmvisatt.models.layers.spatial_decay`). The models build that bias as a
(heads, N, N) tensor once per stage and forward, and hand it to ``scaled_dot_product_attention``: at 1333x800,
RMT-T's stride-16 stage has N = 84 x 50 = 4200 tokens and an 8-head bias of 141 M elements. FlexAttention can
compute the same bias inside its kernel from the token indices (``score_mod``), so nothing of size N x N is
stored, at the cost of compiling a kernel per shape.

:func:`compare_decay_kernels` times the forward and backward of each way on the shapes of a preset at an input
size, with the peak memory on CUDA, and checks that both give the same values; ``tools/analysis/
decay_attention.py`` is its command line. Which way the models' fused path takes is decided on its GPU numbers
(docs/benchmarks.md).
"""
import gc
import statistics
from typing import Callable, Dict, List, Optional, Tuple

import torch
from mmengine.registry import MODELS
from torch import Tensor

from benchmark import pass_ms  # tools/analysis, beside this file
from mmvisatt.models.layers.attention import attention
from mmvisatt.models.layers.spatial_decay import BIAS_FLOOR, SpatialDecay

_MIB = 2.0 ** 20


def grid_decay_score_mod(log_gamma: Tensor, width: int, metric: str) -> Callable:
    """The ``score_mod`` adding ``max(log_gamma[h] * d(n, m), BIAS_FLOOR)`` to each score, with ``d`` the Manhattan
    or Euclidean distance between the raster positions ``n`` and ``m`` of a grid ``width`` tokens wide: the bias
    :meth:`SpatialDecay.grid` builds, computed where it is used."""
    if metric not in ('manhattan', 'euclidean'):
        raise ValueError(f"metric must be 'manhattan' or 'euclidean', got '{metric}'")

    def score_mod(score, batch, head, q_idx, kv_idx):
        dy = (q_idx // width - kv_idx // width).abs()
        dx = (q_idx % width - kv_idx % width).abs()
        if metric == 'manhattan':
            distance = (dy + dx).to(log_gamma.dtype)
        else:
            distance = (dy * dy + dx * dx).to(log_gamma.dtype).sqrt()
        return score + (log_gamma[head] * distance).clamp_min(BIAS_FLOOR).to(score.dtype)

    return score_mod


def flex_decayed_attention(q: Tensor, k: Tensor, v: Tensor, log_gamma: Tensor, width: int, metric: str,
                           flex: Optional[Callable] = None) -> Tensor:
    """``softmax(q k^T + bias) v`` (k pre-scaled) through FlexAttention; q, k, v: (B, heads, N, d) over a grid
    ``width`` tokens wide. ``flex`` is the (compiled) ``flex_attention`` to call; default the eager one, which
    materialises the scores (for checking values, not for speed)."""
    if flex is None:
        from torch.nn.attention.flex_attention import flex_attention as flex
    return flex(q, k, v, score_mod=grid_decay_score_mod(log_gamma, width, metric), scale=1.0)


def mask_decayed_attention(q: Tensor, k: Tensor, v: Tensor, decay: SpatialDecay, height: int, width: int,
                           metric: str) -> Tensor:
    """The models' path: :meth:`SpatialDecay.grid`'s (heads, N, N) bias into the fused attention primitive."""
    return attention(q, k, v, decay.grid(height, width, metric, q.dtype), 1., fused=True)


def decay_stages(preset: str, shape: Tuple[int, int]) -> List[dict]:
    """The full-attention stages of an RMT or EVT preset (``'rmt_t'``, ``'evt_t'``) for an input of ``shape``:
    name, grid, heads, head width, decay rates and metric of each."""
    family, _, arch = preset.partition('_')
    if family not in ('rmt', 'evt') or not arch:
        raise ValueError(f"preset must be rmt_<size> or evt_<size>, got '{preset}'")
    arch_cfg = MODELS.get(family.upper())._resolve_arch(arch)
    full = arch_cfg.get('full_attention') if family == 'evt' else [not d for d in arch_cfg['decomposed']]
    if family == 'evt' and full is None:
        full = [i == len(arch_cfg['depths']) - 1 for i in range(len(arch_cfg['depths']))]
    stages = []
    height, width = shape
    for i, (dim, heads) in enumerate(zip(arch_cfg['embed_dims'], arch_cfg['num_heads'])):
        stride = 2 ** (i + 2)
        if full[i]:
            stages.append(dict(name=f'{preset} stage {i + 1}', grid=(-(-height // stride), -(-width // stride)),
                               heads=heads, head_dim=dim // heads, init_value=arch_cfg['init_values'][i],
                               heads_range=arch_cfg['heads_ranges'][i],
                               metric='manhattan' if family == 'rmt' else 'euclidean'))
    return stages


def _time_ms(run: Callable[[], None], device: torch.device, warmup: int, repeats: int) -> List[float]:
    for _ in range(warmup):
        run()
    return [pass_ms(run, str(device)) for _ in range(repeats)]


def compare_decay_kernels(stage: dict, batch_size: int = 2, dtype: torch.dtype = torch.bfloat16,
                          device: str = 'cuda', compile_flex: bool = True, warmup: int = 3,
                          repeats: int = 10) -> Dict[str, dict]:
    """Forward + backward of one stage's decayed attention by the mask path and by FlexAttention (compiled with
    ``torch.compile`` unless ``compile_flex`` is False), on random q, k, v of the stage's shape: median time (ms),
    peak memory above the inputs on CUDA (MiB), and the largest difference of the two outputs relative to the
    largest output value. FlexAttention has no backward on the CPU, so there both ways time the forward alone
    (``passes``)."""
    device = torch.device(device)
    backward = device.type != 'cpu'
    generator = torch.Generator(device=device).manual_seed(0)
    height, width = stage['grid']
    n = height * width
    decay = SpatialDecay(stage['heads'], stage['init_value'], stage['heads_range']).to(device)
    shape = (batch_size, stage['heads'], n, stage['head_dim'])
    q, k, v = (torch.randn(shape, generator=generator, device=device).to(dtype).requires_grad_(backward)
               for _ in range(3))
    flex = None
    if compile_flex:
        from torch.nn.attention.flex_attention import flex_attention
        flex = torch.compile(flex_attention, dynamic=False)
    ways = {
        'mask + sdpa': lambda: mask_decayed_attention(q, k, v, decay, height, width, stage['metric']),
        'flex score_mod': lambda: flex_decayed_attention(q, k, v, decay.log_gamma, width, stage['metric'], flex),
    }
    results, outputs = {}, {}
    for name, forward in ways.items():
        def step():
            if not backward:
                return forward()
            out = forward()
            out.float().square().mean().backward()
            q.grad = k.grad = v.grad = None
        with torch.no_grad():
            outputs[name] = forward().float()
        peak = None
        if device.type == 'cuda':
            step()
            gc.collect()
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            baseline = torch.cuda.memory_allocated(device)
            step()
            torch.cuda.synchronize(device)
            peak = (torch.cuda.max_memory_allocated(device) - baseline) / _MIB
        times = _time_ms(step, device, warmup, repeats)
        results[name] = dict(time_ms=statistics.median(times), times_ms=[round(t, 3) for t in times],
                             step_peak_mib=peak, passes='forward + backward' if backward else 'forward')
    reference = outputs['mask + sdpa']
    difference = ((outputs['flex score_mod'] - reference).abs().max() / reference.abs().max()).item()
    for result in results.values():
        result['relative_difference'] = difference
    return results
