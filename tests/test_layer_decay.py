"""Layer-wise learning-rate decay: every backbone's ``get_layer_depth`` follows its forward order, and
``LayerDecayOptimWrapperConstructor`` scales each parameter group by it, keeps the weight-decay rules and builds
from mmdet, mmseg and mmpretrain configs in their scopes."""
import importlib
import re

import pytest
import torch
import torch.nn as nn
from mmengine.config import Config
from mmengine.optim import build_optim_wrapper
from mmengine.registry import DefaultScope

from mmvisatt.engine.entrypoints import resolve_amp
from mmvisatt.engine.optimizers import LayerDecayOptimWrapperConstructor
from mmvisatt.models.backbones.evt import EVT
from mmvisatt.models.backbones.fan_hybrid import FANHybrid
from mmvisatt.models.backbones.fan_swin import FANSwin
from mmvisatt.models.backbones.fan_vit import FANViT
from mmvisatt.models.backbones import ReMViTv2, ReSwinTransformer, ReViT
from mmvisatt.models.backbones.rmt import RMT
from mmvisatt.models.backbones.shunted import ShuntedTransformer

from conftest import CONFIGS

DECAY_STAGES = dict(embed_dims=(16, 32, 32, 64), depths=(1, 2, 1, 1), num_heads=(2, 2, 4, 4))
FAMILIES = {
    'revit': lambda: ReViT(arch=dict(embed_dims=32, depth=3, num_heads=4)),
    'reswin': lambda: ReSwinTransformer(arch=dict(embed_dims=16, depths=(1, 2, 1, 1), num_heads=(1, 2, 4, 8))),
    'remvit': lambda: ReMViTv2(arch=dict(embed_dims=16, depths=(1, 1, 2, 1), num_heads=1)),
    'fan_vit': lambda: FANViT(arch=dict(form='vit', embed_dims=32, depth=3, num_heads=2)),
    'fan_vit_cls': lambda: FANViT(arch=dict(form='vit', embed_dims=32, depth=3, num_heads=2),
                                  out_type='cls_token'),
    'fan_hybrid': lambda: FANHybrid(arch=dict(form='hybrid', embed_dims=32, depth=3, num_heads=2,
                                              stem_depths=(1, 2), stem_dims=(16, 24), out_block=1,
                                              down_channels=40)),
    'fan_swin': lambda: FANSwin(arch=dict(form='swin', embed_dims=16, depths=(1, 2, 1, 1),
                                          num_heads=(1, 2, 2, 4))),
    'rmt': lambda **kw: RMT(arch=dict(DECAY_STAGES, decomposed=(True, True, False, False)), **kw),
    'evt': lambda **kw: EVT(arch=DECAY_STAGES, **kw),
    'evt_swin': lambda **kw: EVT(arch=dict(DECAY_STAGES, style='swin'), **kw),
    'shunted': lambda: ShuntedTransformer(arch=dict(DECAY_STAGES, depths=(1, 1, 2, 1), mlp_ratios=(2, 2, 2, 2),
                                                    sr_ratios=(8, 4, 2, 1))),
}
# top-level modules that are new for dense tasks or shared by all blocks: they train at the full rate
TOP = re.compile(r'^(norm\d|pyramid|downsample|alpha)(\.|$)')
BLOCK = re.compile(r'(^|\.)blocks\.\d+$')


class Classifier(nn.Module):
    def __init__(self, backbone: nn.Module):
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(8, 4)


def _depth(model: nn.Module, module_name: str):
    param_name = next(n for n, _ in model.named_parameters(recurse=True) if n.startswith(module_name + '.'))
    return model.get_layer_depth('backbone.' + param_name, prefix='backbone.')


def _first_calls(model: nn.Module, x: torch.Tensor):
    """Names of the modules owning parameters, in the order forward first calls them."""
    order = []
    handles = [m.register_forward_pre_hook(lambda *_, name=name: order.append(name))
               for name, m in model.named_modules()
               if (name and next(m.parameters(recurse=False), None) is not None) or BLOCK.search(name)]
    with torch.no_grad():
        model(x)
    for handle in handles:
        handle.remove()
    return list(dict.fromkeys(order))


@pytest.mark.parametrize('family', sorted(FAMILIES))
def test_layer_ids_follow_the_forward_order(family):
    torch.manual_seed(0)
    model = FAMILIES[family]().eval()
    num_layers = model.get_layer_depth('head.fc.weight', prefix='backbone.')[1]
    top = num_layers - 1
    for name, _ in model.named_parameters():
        layer, num = model.get_layer_depth('backbone.' + name, prefix='backbone.')
        assert num == num_layers and 0 <= layer <= top
        assert (layer == top) == bool(TOP.match(name)), name  # nothing of the pretrained network at the top
    calls = _first_calls(model, torch.randn(1, 3, 64, 64))
    below_top = [_depth(model, n)[0] for n in calls if _depth(model, n)[0] < top]
    assert below_top[0] == 0 and below_top == sorted(below_top)  # stem first, never back to a shallower layer
    assert set(below_top) == set(range(top))  # every layer id below the top is used
    blocks = [_depth(model, n)[0] for n in calls if BLOCK.search(n)]
    assert blocks == list(range(1, len(blocks) + 1))  # each block its own layer, in forward order
    # then the class-attention layer
    assert top - len(blocks) == 1 + (getattr(model, 'cls_attn_blocks', None) is not None)


@pytest.mark.parametrize('family', sorted(FAMILIES))
def test_every_parameter_gets_its_layer_scale(family):
    model = Classifier(FAMILIES[family]())
    wrapper = LayerDecayOptimWrapperConstructor(
        dict(optimizer=dict(type='AdamW', lr=1e-3, weight_decay=0.05)), dict(layer_decay_rate=0.7))(model)
    groups = wrapper.optimizer.param_groups
    grouped = [p for g in groups for p in g['params']]
    assert len(grouped) == len({id(p) for p in grouped}) == len(list(model.parameters()))
    names = {id(p): n for n, p in model.named_parameters()}
    for group in groups:
        name = names[id(group['params'][0])]
        layer, num = model.backbone.get_layer_depth(name, prefix='backbone.')
        assert group['layer_id'] == layer
        assert group['lr'] == pytest.approx(1e-3 * 0.7 ** (num - 1 - layer))
        if name.startswith('head.'):
            assert group['lr'] == 1e-3
    stem = min(g['lr'] for g in groups)
    assert stem == pytest.approx(1e-3 * 0.7 ** (num - 1))


def test_weight_decay_rules_and_lr_mult_combine_with_the_layer_scale():
    model = Classifier(ReSwinTransformer(arch=dict(embed_dims=16, depths=(1, 2, 1, 1), num_heads=(1, 2, 4, 8))))
    paramwise = dict(layer_decay_rate=0.5, norm_decay_mult=0., flat_decay_mult=0.,
                     custom_keys={'relative_position_bias_table': dict(decay_mult=0.), 'alpha': dict(decay_mult=0.),
                                  'head': dict(lr_mult=10.)})
    groups = LayerDecayOptimWrapperConstructor(dict(optimizer=dict(type='AdamW', lr=1e-3, weight_decay=0.05)),
                                               paramwise)(model).optimizer.param_groups
    by_name = {n: g for g in groups for n, p in model.named_parameters() if p is g['params'][0]}
    num = model.backbone.get_layer_depth('head.weight', prefix='backbone.')[1]
    block = by_name['backbone.stages.1.blocks.0.attn.qkv.weight']
    assert block['weight_decay'] == 0.05 and block['lr'] == pytest.approx(1e-3 * 0.5 ** (num - 1 - 2))
    for name in ('backbone.stages.1.blocks.0.norm1.weight', 'backbone.stages.1.blocks.0.attn.qkv.bias',
                 'backbone.stages.1.blocks.0.attn.relative_position_bias_table', 'backbone.alpha',
                 'backbone.patch_embed.norm.bias', 'backbone.norm3.weight'):
        assert by_name[name]['weight_decay'] == 0, name
    assert by_name['backbone.stages.1.blocks.0.attn.relative_position_bias_table']['lr'] == block['lr']
    assert by_name['backbone.alpha']['lr'] == 1e-3
    assert by_name['head.weight']['lr'] == pytest.approx(1e-2) and by_name['head.weight']['weight_decay'] == 0.05


def test_distributed_wrapper_is_looked_through():
    """DDP / mmengine wrappers hold the model as ``.module``; the layer ids are read from the model inside."""
    model = Classifier(FAMILIES['rmt']())
    wrapped = nn.Module()
    wrapped.module = model
    constructor = LayerDecayOptimWrapperConstructor(dict(optimizer=dict(type='SGD', lr=0.1)),
                                                    dict(layer_decay_rate=0.5))
    plain = [g['lr'] for g in constructor(model).optimizer.param_groups]
    assert [g['lr'] for g in constructor(wrapped).optimizer.param_groups] == plain and len(set(plain)) > 2


def test_bad_configurations_say_what_to_do():
    optim = dict(optimizer=dict(type='AdamW', lr=1e-3, weight_decay=0.05))
    with pytest.raises(ValueError, match='layer_decay_rate=...'):
        LayerDecayOptimWrapperConstructor(optim, dict(norm_decay_mult=0.))
    with pytest.raises(ValueError, match=r'in \(0, 1\]'):
        LayerDecayOptimWrapperConstructor(optim, dict(layer_decay_rate=0.))
    model = Classifier(nn.Conv2d(3, 8, 3))
    with pytest.raises(TypeError, match='Conv2d has none'):
        LayerDecayOptimWrapperConstructor(optim, dict(layer_decay_rate=0.7))(model)


LAYER_DECAY = "optim_wrapper = dict(constructor='LayerDecayOptimWrapperConstructor', " \
              "paramwise_cfg=dict(layer_decay_rate=0.7))\n"
TINY_RESWIN = 'arch=dict(_delete_=True, embed_dims=16, depths=(1, 1, 1, 1), num_heads=(1, 1, 2, 2))'


def _build_in_scope(path: str):
    """The model and optimizer wrapper of a config, built as mmengine's Runner builds them (after tools/train.py's
    fp16 -> float32 fallback on a CPU)."""
    cfg = Config.fromfile(path)
    resolve_amp(cfg)
    scope = cfg.default_scope
    registry = importlib.import_module(f'{scope}.registry')
    with DefaultScope.overwrite_default_scope(scope):
        model = registry.MODELS.build(cfg.model)
        return model, build_optim_wrapper(model, cfg.optim_wrapper), cfg


def _check_scaled(model, wrapper, cfg, neck: str):
    groups = wrapper.optimizer.param_groups
    names = {id(p): n for n, p in model.named_parameters()}
    base = cfg.optim_wrapper.optimizer.lr
    num = model.backbone.get_layer_depth('head.fc.weight', prefix='backbone.')[1]
    assert {g['layer_id'] for g in groups} == set(range(num))
    for group in groups:
        name = names[id(group['params'][0])]
        assert group['lr'] == pytest.approx(base * 0.7 ** (num - 1 - group['layer_id']))
        if name.startswith(neck):
            assert group['layer_id'] == num - 1
        if 'norm' in name:  # the config's no-decay keys still apply
            assert group['weight_decay'] == 0
    lrs = {names[id(g['params'][0])]: g['lr'] for g in groups}
    assert any(name.startswith(neck) for name in lrs)
    return lrs


def test_builds_from_an_mmdet_detector_config(tiny_det_config, tmp_path):
    path = tmp_path / 'mask_rcnn_layer_decay.py'
    path.write_text(f'_base_ = [{tiny_det_config!r}]\n' + LAYER_DECAY)
    model, wrapper, cfg = _build_in_scope(str(path))
    assert cfg.default_scope == 'mmdet'
    _check_scaled(model, wrapper, cfg, neck='neck.')


def test_builds_from_an_mmseg_config(tmp_path):
    path = tmp_path / 'upernet_layer_decay.py'
    path.write_text(f"_base_ = [{str(CONFIGS + '/upernet_reswin_t_160k_ade20k.py')!r}]\n"
                    f'model = dict(backbone=dict({TINY_RESWIN}), decode_head=dict(in_channels=[16, 32, 64, 128], '
                    'channels=16), auxiliary_head=dict(in_channels=64, channels=16))\n' + LAYER_DECAY)
    model, wrapper, cfg = _build_in_scope(str(path))
    assert cfg.default_scope == 'mmseg'
    _check_scaled(model, wrapper, cfg, neck='decode_head.')


def test_builds_from_an_mmpretrain_classifier_config_like_mmpretrain_own_constructor(tmp_path):
    """RMT + RMTProjectionNeck: the neck is in the top layer; mmpretrain's own layer-decay constructor reads the
    same layer ids and gives the same learning rates."""
    path = tmp_path / 'imagenet_layer_decay.py'
    path.write_text(f"_base_ = [{str(CONFIGS + '/imagenet_reswin_t.py')!r}]\n"
                    f"model = dict(backbone=dict(_delete_=True, type='RMT', arch={DECAY_STAGES!r}, "
                    "out_indices=(3, ), out_norms=False), neck=dict(_delete_=True, type='RMTProjectionNeck', "
                    'in_channels=64, projection=32), head=dict(in_channels=32))\n' + LAYER_DECAY)
    model, wrapper, cfg = _build_in_scope(str(path))
    assert cfg.default_scope == 'mmpretrain'
    ours = _check_scaled(model, wrapper, cfg, neck='neck.')
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        theirs = build_optim_wrapper(model, dict(cfg.optim_wrapper,
                                                 constructor='LearningRateDecayOptimWrapperConstructor'))
    names = {id(p): n for n, p in model.named_parameters()}
    assert {names[id(g['params'][0])]: g['lr'] for g in theirs.optimizer.param_groups} == pytest.approx(ours)
