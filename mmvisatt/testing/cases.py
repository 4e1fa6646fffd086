"""Backbone cases the tests share: a tiny arch of every form (each with two attention paths), the T-size preset of
every form, and builders for same-weight model pairs.

The CPU tests (``tests/test_fast_paths.py``, ``tests/test_half_precision.py``) and the CUDA tests
(``tests/test_cuda.py``) read the same cases, so a form added here is checked on both devices.
"""
from typing import Dict, List, Tuple

import torch
import torch.nn as nn
from mmengine.registry import MODELS

import mmvisatt.models  # noqa: F401  (registers the backbones)

_SMALL = dict(embed_dims=(16, 32, 32, 64), num_heads=(2, 2, 4, 4))

# name -> (registered type, constructor arguments): every form, tiny; each has a reference and a fused path
TINY_CASES: Dict[str, Tuple[str, dict]] = {
    'rmt': ('RMT', dict(arch=dict(_SMALL, depths=(1, 2, 1, 1), decomposed=(True, True, False, False),
                                  layer_scales=(False, False, True, True)))),
    'evt': ('EVT', dict(arch=dict(_SMALL, depths=(2, 2, 1, 1)))),
    'evt_swin': ('EVT', dict(arch=dict(style='swin', embed_dims=(16, 32, 32, 64), depths=(2, 2, 2, 2),
                                       num_heads=(1, 2, 2, 4)))),
    'shunted': ('ShuntedTransformer', dict(arch=dict(_SMALL, depths=(1, 1, 1, 1), mlp_ratios=(2, 2, 2, 2),
                                                     sr_ratios=(8, 4, 2, 1)))),
    'fan_vit': ('FANViT', dict(arch=dict(form='vit', embed_dims=32, depth=2, num_heads=2))),
    'fan_hybrid': ('FANHybrid', dict(arch=dict(form='hybrid', embed_dims=32, depth=3, num_heads=2,
                                               stem_depths=(1, 1), stem_dims=(16, 24), out_block=1, down_channels=40))),
    'fan_swin': ('FANSwin', dict(arch=dict(form='swin', embed_dims=16, depths=(1, 2, 1, 1),
                                           num_heads=(1, 2, 2, 4)))),
    'reswin': ('ReSwinTransformer', dict(arch=dict(embed_dims=16, depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8)))),
    'reswin_official': ('ReSwinTransformer', dict(arch=dict(embed_dims=16, depths=(2, 2, 2, 2),
                                                            num_heads=(1, 2, 4, 8)), residual_mode='official')),
    'revit': ('ReViT', dict(arch=dict(embed_dims=32, depth=3, num_heads=4))),
    'remvit': ('ReMViTv2', dict(arch=dict(embed_dims=16, depths=(1, 2, 1, 1), num_heads=1))),
}

# (registered type, preset): the T-size preset of every form (ReViT's smallest is B)
T_PRESETS: List[Tuple[str, str]] = [
    ('RMT', 't'), ('EVT', 't'), ('EVT', 'swin_t'), ('FANViT', 'vit_t'), ('FANHybrid', 'hybrid_t'),
    ('FANSwin', 'swin_t'),
    ('ReSwinTransformer', 't'), ('ReMViTv2', 't'), ('ReViT', 'b'), ('ShuntedTransformer', 't')]
T_PRESET_IDS = [f'{name}-{arch}' for name, arch in T_PRESETS]


def resolve_arch(name: str, arch) -> dict:
    """The arch dict a registered backbone type builds from ``arch``."""
    return dict(MODELS.get(name)._resolve_arch(arch))


def one_block_per_stage(name: str, arch: str) -> dict:
    """The preset's arch with one block per stage (two for the single-stage ViTs, whose residual gate acts from
    the second block on): the widths and attention layouts stay, the depth goes."""
    arch = resolve_arch(name, arch)
    for key in ('depths', 'depth'):
        if isinstance(arch.get(key), (list, tuple)):
            arch[key] = [1] * len(arch[key])
        elif isinstance(arch.get(key), int):
            arch[key] = 2
    if 'out_block' in arch:
        arch['out_block'] = 1
    return arch


def perturb(model: nn.Module, scale: float = 0.05, seed: int = 0) -> nn.Module:
    """Move every weight away from its initial value and BatchNorm statistics away from (0, 1), in place: layer
    scales of 1e-6 or zero-initialised tables would hide the attention a comparison is meant to check."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator).to(p) * scale)
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.running_mean.copy_(torch.rand(m.running_mean.shape, generator=generator) - 0.5)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=generator) * 1.5 + 0.5)
    return model


def build(name: str, seed: int = 0, scale: float = 0.05, **kwargs) -> nn.Module:
    """A ``name`` backbone without drop path, initialised and :func:`perturb`-ed from ``seed``, float32 on the CPU,
    eval mode."""
    torch.manual_seed(seed)
    model = MODELS.get(name)(**{'drop_path_rate': 0., **kwargs})
    model.init_weights()
    return perturb(model, scale, seed).eval()


def fused_reference_pair(name: str, kwargs: dict, seed: int = 0,
                         scale: float = 0.05) -> Tuple[nn.Module, nn.Module]:
    """(fused_attn=True, fused_attn=False) models of type ``name`` with the same weights (see :func:`build`)."""
    fused = build(name, seed, scale, fused_attn=True, **kwargs)
    reference = MODELS.get(name)(drop_path_rate=0., fused_attn=False, **kwargs)
    reference.load_state_dict(fused.state_dict())
    return fused, reference.eval()
