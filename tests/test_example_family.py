"""A backbone family added the way docs/contributing.md says (one file, ``tests/example_family/toy_pyramid.py``,
plus its ``_base_`` preset ``toy_t.py``): it registers, builds from a task config over the shipped ``_base_``
files, trains a Mask R-CNN step, and has the layer ids and the freezing of every other family."""
import os.path as osp

import pytest
import torch
from mmengine.config import Config
from mmengine.optim import build_optim_wrapper
from mmengine.registry import MODELS as ROOT_MODELS

HERE = osp.dirname(osp.abspath(__file__))
CONFIGS = osp.join(osp.dirname(HERE), 'configs')


@pytest.fixture
def task_config(tmp_path, monkeypatch) -> Config:
    """A Mask R-CNN task config over the shipped _base_ files and the example's preset, importing the family file
    as a plugin module (custom_imports), with layer-wise decay and the first stage frozen."""
    monkeypatch.syspath_prepend(HERE)
    path = tmp_path / 'mask_rcnn_toy_t_1x.py'
    path.write_text(
        f"_base_ = [{osp.join(CONFIGS, '_base_', 'models', 'mask_rcnn_fpn.py')!r},\n"
        f"          {osp.join(CONFIGS, '_base_', 'default_runtime_det.py')!r},\n"
        f"          {osp.join(HERE, 'example_family', 'toy_t.py')!r}]\n"
        "custom_imports = dict(imports=['mmvisatt.models', 'mmvisatt.engine', 'example_family.toy_pyramid'],\n"
        "                      allow_failed_imports=False)\n"
        "model = dict(backbone=dict(_base_.preset.backbone, frozen_stages=1),\n"
        "             neck=dict(in_channels=_base_.preset.channels))\n"
        "optim_wrapper = dict(type='OptimWrapper', optimizer=dict(type='AdamW', lr=1e-4, weight_decay=0.05),\n"
        "                     constructor='LayerDecayOptimWrapperConstructor',\n"
        "                     paramwise_cfg=dict(layer_decay_rate=0.5, norm_decay_mult=0.))\n")
    # loading the config imports the family file, which registers ToyPyramid (once per test session)
    return Config.fromfile(str(path))


def _build(cfg: Config):
    from mmdet.registry import MODELS
    from mmdet.utils import register_all_modules
    from mmengine.utils import import_modules_from_strings
    register_all_modules()
    import_modules_from_strings(**cfg.custom_imports)
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()
    return model


def test_the_family_registers_and_steps_in_mask_rcnn(task_config):
    from mmdet.testing import demo_mm_inputs
    model = _build(task_config)
    assert type(model.backbone).__name__ == 'ToyPyramid'
    assert ROOT_MODELS.get('ToyPyramid') is type(model.backbone)
    assert [o.shape[1] for o in model.backbone(torch.randn(1, 3, 64, 96))] == task_config.preset.channels

    optim_wrapper = build_optim_wrapper(model, task_config.optim_wrapper)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    data = demo_mm_inputs(batch_size=2, image_shapes=[(3, 128, 160), (3, 96, 128)], num_items=[3, 2],
                          num_classes=80, with_mask=True)
    losses = model.train_step(data, optim_wrapper)
    assert {'loss_rpn_cls', 'loss_cls', 'loss_mask'} <= set(losses)
    assert all(torch.isfinite(v).all() for v in losses.values())
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    # the frozen stem and first stage did not move; the later stages, the neck and the heads did
    assert not any(n.startswith(('backbone.patch_embed.', 'backbone.stages.0.')) for n in changed)
    assert any(n.startswith('backbone.stages.3.') for n in changed) and any(n.startswith('neck.') for n in changed)
    assert not model.backbone.stages[0].training and model.backbone.stages[1].training


def test_the_family_has_layer_ids_for_layer_wise_decay(task_config):
    model = _build(task_config)
    backbone = model.backbone
    depth = {n: backbone.get_layer_depth(n, prefix='backbone.')[0] for n, _ in model.named_parameters()}
    num_layers = backbone.get_layer_depth('backbone.patch_embed.proj.weight', prefix='backbone.')[1]
    assert num_layers == 5 + 2  # stem 0, five blocks, the top
    assert depth['backbone.patch_embed.proj.weight'] == 0
    assert depth['backbone.stages.0.blocks.0.attn.qkv.weight'] == 1
    # patch merging belongs to the layer of the block before it (mmpretrain's Swin rule)
    assert depth['backbone.stages.1.downsample.reduction.weight'] == 1
    assert depth['backbone.stages.2.blocks.1.mlp.fc2.weight'] == 4
    assert depth['backbone.stages.3.blocks.0.norm1.weight'] == 5
    assert depth['backbone.norm3.weight'] == depth['neck.lateral_convs.0.conv.weight'] == num_layers - 1

    optim_wrapper = build_optim_wrapper(model, task_config.optim_wrapper)
    scale = {id(p): g.get('lr_scale') for g in optim_wrapper.param_groups for p in g['params']}
    params = dict(model.named_parameters())
    assert scale[id(params['backbone.stages.3.blocks.0.attn.qkv.weight'])] == 0.5
    assert scale[id(params['backbone.stages.2.blocks.0.attn.qkv.weight'])] == 0.5 ** 3
    assert scale[id(params['neck.fpn_convs.0.conv.weight'])] == 1.0


def test_the_family_checks_its_presets_and_inputs(task_config):
    model = _build(task_config)
    family = type(model.backbone)
    assert family._resolve_arch('toy_t') == family._resolve_arch('tiny') == family.arch_zoo['t']
    with pytest.raises(ValueError, match="Unknown ToyPyramid arch 'toy_s'"):
        family(arch='toy_s')
    with pytest.raises(ValueError, match='one entry per stage'):
        family(arch=dict(embed_dims=(8, 16), depths=(1, 1, 1), num_heads=(1, 1)))
    with pytest.raises(ValueError, match='in_channels=1'):
        model.backbone(torch.randn(1, 1, 64, 64))
    fused, reference = family(fused_attn=True).eval(), family(fused_attn=False).eval()
    reference.load_state_dict(fused.state_dict())
    x = torch.randn(1, 3, 40, 56)
    with torch.no_grad():
        for a, b in zip(fused(x), reference(x)):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
