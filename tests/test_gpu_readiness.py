"""What a training step of every T preset would do on a GPU, proven on the meta device (docs/performance.md,
"GPU readiness"): construction without host weights, no host tensor or read-back in forward + backward, an op
count that does not grow with the batch, and bounded recompiles under ``torch.compile(dynamic=True)``."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from mmvisatt.models.layers import score_memory
from mmvisatt.models.layers.residual_attention import _slot_sources
from mmvisatt.testing.cases import T_PRESET_IDS, T_PRESETS, one_block_per_stage
from mmvisatt.testing.device_audit import StepAudit, audit_training_step, build_on_device, count_compiles

# the settings the configs add to the presets: every ReMViTv2 config hands off, ReViT-B's detectors carry factors
CONFIG_SETTINGS = [('ReMViTv2', 't', dict(score_memory='handoff')), ('ReViT', 'b', dict(score_memory='factors')),
                   ('ReSwinTransformer', 't', dict(with_cp=True))]
CASES = [(name, arch, {}) for name, arch in T_PRESETS] + CONFIG_SETTINGS
CASE_IDS = T_PRESET_IDS + [f'{n}-{a}-{"-".join(map(str, k.values()))}' for n, a, k in CONFIG_SETTINGS]
# the largest growth of the op count from 1 to 8 images allowed
MAX_GROWTH = 0.05


@pytest.mark.parametrize('name,arch,kwargs', CASES, ids=CASE_IDS)
def test_training_step_on_the_meta_device(name, arch, kwargs):
    """Built under torch.device('meta'), a step runs with nothing made on the host (a read-back such as .item()
    fails on meta by itself) and launches at most 5% more ops at 8 images than at 1."""
    model = build_on_device(name, arch, 'meta', **kwargs)
    assert all(p.device.type == 'meta' for p in model.parameters())
    one = audit_training_step(model, 1, 256, 320)
    eight = audit_training_step(model, 8, 256, 320)
    odd = audit_training_step(model, 2, 224, 288)
    assert not one.foreign + eight.foreign + odd.foreign, f'host tensors in a step: {one.foreign[:5]}'
    assert eight.ops <= (1 + MAX_GROWTH) * one.ops, (one.ops, eight.ops)


class _HostIndex(nn.Module):
    """What the audit exists to catch: an index built on the host in every forward and copied over."""

    def forward(self, x):
        return x[:, torch.arange(2).to(x.device)]


class _PerImage(nn.Module):
    def forward(self, x):
        return torch.cat([F.softmax(image, -1)[None] for image in x])


def test_the_audit_sees_host_tensors_and_per_image_loops():
    x = torch.empty(8, 3, 4, device='meta')
    with StepAudit('meta') as audit:
        _HostIndex()(x)
    assert [role for role, device, _ in audit.foreign] and {d for _, d, _ in audit.foreign} == {'cpu'}
    counts = []
    for batch in (1, 8):
        with StepAudit('meta') as audit:
            _PerImage()(x[:batch])
        counts.append(audit.total)
    assert counts[1] > (1 + MAX_GROWTH) * counts[0]
    with pytest.raises(Exception):
        (x.sum() > 0).item()  # a read-back fails on meta


def test_slot_sources_are_nearest_interpolation():
    """The official ReSwin alignment's slot index, made on the device, equals F.interpolate's nearest pick."""
    for prev in range(1, 150):
        for cur in list(range(1, 60)) + [2 * prev, 4 * prev, 3 * prev + 1]:
            positions = torch.arange(prev, dtype=torch.float64).view(1, 1, -1, 1, 1)
            expected = F.interpolate(positions, size=(cur, 1, 1)).view(-1).long()
            assert torch.equal(_slot_sources(prev, cur, torch.device('cpu')), expected), (prev, cur)
    assert _slot_sources(6, 12, torch.device('meta')).device.type == 'meta'


def test_chunk_size_is_one_global_setting_that_changes_no_value():
    from mmvisatt.testing.cases import build
    arch = dict(embed_dims=32, depth=3, num_heads=4)
    default = score_memory.score_chunk_numel()
    meta = build_on_device('ReViT', arch, 'meta', score_memory='factors')
    model = build('ReViT', arch=arch, score_memory='factors').double()
    x = torch.randn(2, 3, 64, 80, dtype=torch.float64)
    ops, outs = audit_training_step(meta, 2, 64, 64).ops, model(x)
    try:
        score_memory.set_score_chunk_numel(256)
        # a small chunk splits each block's softmax into many row chunks, each a few ops more
        assert audit_training_step(meta, 2, 64, 64).ops > ops + 50
        for a, b in zip(outs, model(x)):
            torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-12)
    finally:
        score_memory.set_score_chunk_numel(default)


# The 3x recipe's padded sizes for 4:3 images with shorter sides 480, 640 and 800. Tracing with symbolic shapes
# takes three minutes per model on this CPU whatever its depth; tools/analysis/gpu_readiness.py --compile counts
# every preset (docs/performance.md), the suite the headline ReSwin-T and ReMViTv2-T as its configs build it.
COMPILE_SIZES = ((480, 640), (640, 864), (800, 1088))


@pytest.mark.slow
@pytest.mark.parametrize('name,arch,kwargs', [('ReSwinTransformer', 't', {}), ('ReMViTv2', 't', {})],
                         ids=['ReSwinTransformer-t', 'ReMViTv2-t'])
def test_compiles_once_across_multi_scale_sizes(name, arch, kwargs):
    model = build_on_device(name, one_block_per_stage(name, arch), 'meta', **kwargs)
    graphs = count_compiles(model, COMPILE_SIZES)
    # one stage geometry across the multi-scale sizes: whatever the first compile made, no size recompiles
    assert graphs[0] >= 1 and len(set(graphs)) == 1, graphs


def test_preflight_warns_when_compile_meets_a_chunked_strategy():
    import os.path as osp

    from mmengine.config import Config

    from mmvisatt.engine.preflight import check_compile_memory_paths
    config = osp.join(osp.dirname(osp.dirname(osp.abspath(__file__))), 'configs', 'mask_rcnn_remvit_t_3x.py')
    cfg = Config.fromfile(config)
    assert cfg.model.backbone.score_memory == 'handoff' and check_compile_memory_paths(cfg) == []
    cfg.compile = True
    (message, ) = check_compile_memory_paths(cfg)
    assert "model.backbone.score_memory='handoff'" in message and "score_memory='full' compiles" in message
    cfg.model.backbone.score_memory = 'full'
    assert check_compile_memory_paths(cfg) == []
