"""fp16 at detection sizes: every backbone form's forward at 1333x800 under fp16 autocast is finite, and a training
step under fp16 autocast with a GradScaler, as the fp16 recipes (``AmpOptimWrapper``) take it, has finite unscaled
gradients.

This runs on the CPU (torch's CPU autocast has an fp16 policy). The presets' widths and attention layouts are
kept, with one block per stage (two for the single-stage ViTs), so the half-precision hazards of a full-size map
are there: long softmaxes and token reductions, decay biases over 334x200 tokens, window and group masks, the
score carry of residual attention. fp16 kernels are slow on this CPU (ReMViTv2-T's forward takes about 2 minutes
at 1333x800, 3x its bf16 time), so the training step runs at 256x384. CUDA's autocast casts a few more ops to fp32
than the CPU's; the ``cuda`` marked tests are where a GPU checks its own policy.
"""
import pytest
import torch
from mmengine.registry import MODELS

import mmvisatt.models  # noqa: F401  (registers the backbones)

FORMS = [('RMT', 't'), ('EVT', 't'), ('EVT', 'swin_t'), ('FAN', 'vit_t'), ('FAN', 'hybrid_t'), ('FAN', 'swin_t'),
         ('ReSwinTransformer', 't'), ('ReMViTv2', 't'), ('ReViT', 'b'), ('ShuntedTransformer', 't')]


def _one_block_per_stage(cls, arch: str) -> dict:
    arch = dict(cls._resolve_arch(arch))
    for key in ('depths', 'depth'):
        if isinstance(arch.get(key), (list, tuple)):
            arch[key] = [1] * len(arch[key])
        elif isinstance(arch.get(key), int):
            arch[key] = 2  # the residual gate of a single-stage ViT acts from its second block on
    if 'out_block' in arch:
        arch['out_block'] = 1
    return arch


def _model(name: str, arch: str):
    cls = MODELS.get(name)
    torch.manual_seed(0)
    model = cls(arch=_one_block_per_stage(cls, arch), drop_path_rate=0.)
    model.init_weights()
    return model.train()


IDS = [f'{n}-{a}' for n, a in FORMS]


@pytest.mark.slow
@pytest.mark.parametrize('name,arch', FORMS, ids=IDS)
def test_fp16_forward_at_1333x800_is_finite(name, arch):
    model = _model(name, arch)
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.float16):
        outs = model(torch.randn(1, 3, 800, 1333))
    assert all(torch.isfinite(o).all() for o in outs)


@pytest.mark.parametrize('name,arch', FORMS, ids=IDS)
def test_fp16_training_step_with_grad_scaler_is_finite(name, arch):
    model = _model(name, arch)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.)
    scaler = torch.amp.GradScaler('cpu')
    with torch.autocast('cpu', dtype=torch.float16):
        outs = model(torch.randn(1, 3, 256, 384))
        loss = sum(o.float().pow(2).mean() for o in outs)
    assert all(torch.isfinite(o).all() for o in outs)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    grads = [(n, p.grad) for n, p in model.named_parameters() if p.grad is not None]
    assert grads
    bad = [n for n, g in grads if not torch.isfinite(g).all()]
    assert not bad, bad[:5]
