"""fp16 on the CPU: a training step of every backbone form under fp16 autocast with a GradScaler, as the fp16 recipes
(``AmpOptimWrapper``) take it, has finite outputs and finite unscaled gradients.

The presets' widths and attention layouts are kept, with one block per stage (two for the single-stage ViTs), so
the half-precision hazards are there: long softmaxes and token reductions, decay biases, window and group masks,
the score carry of residual attention. fp16 kernels are slow on a CPU (ReMViTv2-T's forward took about 2 minutes
at 1333x800, 3x its bf16 time), so the step runs at 256x384; the full presets at 1333x800, forward and backward in
bf16 and fp16 under CUDA's own autocast policy, are ``tests/test_cuda.py``'s.
"""
import pytest
import torch
from mmengine.registry import MODELS

from mmvisatt.testing.cases import T_PRESET_IDS, T_PRESETS, one_block_per_stage


def _model(name: str, arch: str):
    torch.manual_seed(0)
    model = MODELS.get(name)(arch=one_block_per_stage(name, arch), drop_path_rate=0.)
    model.init_weights()
    return model.train()


@pytest.mark.parametrize('name,arch', T_PRESETS, ids=T_PRESET_IDS)
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
