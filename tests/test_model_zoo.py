"""The model zoo: our presets have the official parameter counts (within 2%), the generator writes what it
measures, the cache makes reruns incremental, and the FLOP count follows the documented convention."""
import json
import os.path as osp

import pytest
import torch
from mmengine.registry import MODELS, DefaultScope
from torch.utils.flop_counter import FlopCounterMode

from conftest import CONFIGS
from mmvisatt.analysis import model_zoo
from mmvisatt.analysis.model_zoo import (ModelZooError, build_model, count_macs, discover_configs, load_config,
                                         measure, param_difference)
from mmvisatt.analysis.paper_results import NO_OFFICIAL_COUNT, OFFICIAL, OFFICIAL_DENSE, REPORTED
from mmvisatt.task_configs import RECIPES, backbone_tokens, recipe_key

TOLERANCE_PERCENT = 2.


def test_every_preset_has_an_official_count_or_a_reason():
    tokens = set(backbone_tokens(CONFIGS))
    assert set(OFFICIAL) | set(NO_OFFICIAL_COUNT) == tokens
    assert not set(OFFICIAL) & set(NO_OFFICIAL_COUNT)
    keys = {recipe_key(r) for r in RECIPES}
    assert all(t in tokens and k in keys for t, k in REPORTED), 'a reported row names no preset / recipe'
    assert all(r.source for r in REPORTED.values())


@pytest.mark.parametrize('token', sorted(t for t, o in OFFICIAL.items() if o.params is not None))
def test_classifier_params_match_the_official_classifier(token):
    """Like with like: our ImageNet config (backbone + the official head layout, 1000 classes) against the official
    classifier's own count with 1000 classes."""
    ours = measure(osp.join(CONFIGS, f'imagenet_{token}.py'), flops=False).params
    official = OFFICIAL[token].params
    assert abs(param_difference(ours, official)) <= TOLERANCE_PERCENT, \
        f'{token}: {ours} parameters, the official classifier has {official}'


def _cpu_attention_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs):
    # QK^T and (attention)V, 2 FLOPs per multiply-add
    b, h, q, d = query_shape
    k, dv = key_shape[-2], value_shape[-1]
    return 2 * b * h * q * k * d + 2 * b * h * q * k * dv


@pytest.mark.parametrize('token', sorted(OFFICIAL_DENSE))
def test_dense_backbone_params_match_the_official_detection_backbone(token):
    """FAN released detection backbones: the dense configs build the official detection backbone (no output norms,
    recipe table), so the counts are equal."""
    full = measure(osp.join(CONFIGS, f'mask_rcnn_{token}_1x.py'), flops=False).backbone_params
    count = OFFICIAL_DENSE[token][0]
    assert full == count, f'{token}: {full} vs official {count}'


def _independent_params(path):
    """Parameters counted without the zoo's helpers: build in the config's scope and sum."""
    cfg = load_config(path)
    with DefaultScope.overwrite_default_scope(cfg.default_scope):
        model = MODELS.build(cfg.model)
    return sum(p.numel() for p in model.parameters()), sum(p.numel() for p in model.backbone.parameters())


def _row(markdown: str, config: str) -> str:
    rows = [line for line in markdown.splitlines() if line.startswith(f'| `{config}` |')]
    assert len(rows) == 1, f'{config}: {len(rows)} rows'
    return rows[0]


def test_generator_on_a_subset_writes_measured_numbers(tmp_path, capsys):
    names = ['imagenet_shunted_t', 'mask_rcnn_shunted_t_1x', 'upernet_shunted_t_160k_ade20k']
    out = tmp_path / 'zoo.md'
    model_zoo.main(['--configs'] + [f'{n}.py' for n in names] + ['--out', str(out), '--no-flops', '--json'])
    out_text = capsys.readouterr().out  # mmengine's logger may print before the JSON
    printed = json.loads(out_text[out_text.index('[\n'):])
    assert [m['config'] for m in printed] == names
    text = out.read_text()
    assert 'python tools/analysis/model_zoo.py --configs' in text and 'CPU cores' in text
    cache = json.loads((tmp_path / 'zoo.json').read_text())['configs']
    for name in names:
        params, backbone = _independent_params(osp.join(CONFIGS, f'{name}.py'))
        assert cache[name]['params'] == params and cache[name]['backbone_params'] == backbone
        assert cache[name]['macs'] is None
        row = _row(text, name)
        assert f'| {params / 1e6:.2f}M / ' in row and f'| {backbone / 1e6:.2f}M / not measured |' in row
    # the backbone table compares the classifier with the official count
    official = OFFICIAL['shunted_t'].params
    assert f'{official / 1e6:.2f}M (`shunted_t`)' in text
    assert f'{param_difference(cache["imagenet_shunted_t"]["params"], official):+.3f}%' in text
    # reported numbers appear with their source; missing ones say so
    assert 'not reported' in _row(text, 'mask_rcnn_shunted_t_1x')
    paper = REPORTED[('shunted_t', 'imagenet')]
    assert _row(text, 'imagenet_shunted_t').endswith(f'| {paper.metrics["top-1"]:.1f} | [1] |')
    assert f'- [1] {paper.source}' in text

    # a rerun with FLOPs measures only what lacks them (the cached entries of the others are kept as they are)
    cache['mask_rcnn_shunted_t_1x']['backbone_params'] = -1  # a marker: a re-measured entry would lose it
    (tmp_path / 'zoo.json').write_text(json.dumps(dict(configs=cache)))
    model_zoo.main(['--configs', 'imagenet_shunted_t.py', 'mask_rcnn_shunted_t_1x.py', '--out', str(out),
                    '--no-flops'])
    assert json.loads((tmp_path / 'zoo.json').read_text())['configs']['mask_rcnn_shunted_t_1x'][
        'backbone_params'] == -1
    model_zoo.main(['--configs', 'imagenet_shunted_t.py', '--out', str(out)])
    entry = json.loads((tmp_path / 'zoo.json').read_text())['configs']['imagenet_shunted_t']
    # freshly counted on a real CPU forward (the zoo counts on the meta device, where attention becomes bmm; on
    # the CPU it is one fused kernel that torch's table lacks, so the count adds it)
    cfg = load_config(osp.join(CONFIGS, 'imagenet_shunted_t.py'))
    model = build_model(cfg, 'mmpretrain')
    counter = FlopCounterMode(display=False, custom_mapping={
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_attention_flops})
    with counter, torch.no_grad():
        model(torch.rand(1, 3, 224, 224), mode='tensor')
    assert entry['macs'] == counter.get_total_flops() // 2
    assert f'| {entry["macs"] / 1e9:.2f}G / not reported |' in _row(out.read_text(), 'imagenet_shunted_t')


def test_detector_macs_follow_the_convention(tiny_det_config):
    """Meta-device count of backbone + neck + RPN plus the RoI heads on 1000 proposals equals a real CPU forward
    of the same parts (the standard RoI head's forward already runs its mask head on the first 100 RoIs)."""
    from mmdet.structures import DetDataSample
    from mmengine.structures import InstanceData
    cfg = load_config(tiny_det_config)
    # narrow heads: the RoI part runs for real on 1000 proposals
    cfg.model.neck.out_channels = 8
    cfg.model.rpn_head.update(in_channels=8, feat_channels=8)
    roi = cfg.model.roi_head
    roi.bbox_roi_extractor.out_channels = roi.mask_roi_extractor.out_channels = 8
    roi.bbox_head.update(in_channels=8, fc_out_channels=16)
    roi.mask_head.update(in_channels=8, conv_out_channels=8)
    hw = (64, 96)
    zoo_total, zoo_backbone = count_macs(build_model(cfg, 'mmdet'), cfg, 'mmdet', hw)
    model = build_model(cfg, 'mmdet')
    sample = DetDataSample(metainfo=dict(img_shape=hw, ori_shape=hw, pad_shape=hw, batch_input_shape=hw,
                                         scale_factor=(1., 1.)))
    proposals = InstanceData(bboxes=model_zoo._fixed_proposals(*hw, 1000))
    counter = FlopCounterMode(display=False, custom_mapping={
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_attention_flops})
    with counter, torch.no_grad():
        feats = model.extract_feat(torch.rand(1, 3, *hw))
        model.rpn_head.forward(feats)
        model.roi_head.forward(feats, [proposals], [sample])
    assert zoo_total == counter.get_total_flops() // 2
    with FlopCounterMode(display=False, custom_mapping={
            torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_attention_flops}) as backbone_counter, \
            torch.no_grad():
        model.backbone(torch.rand(1, 3, *hw))
    assert zoo_backbone == backbone_counter.get_total_flops() // 2


def test_bad_input_says_what_to_do(tmp_path):
    with pytest.raises(ModelZooError, match='globs'):
        discover_configs(CONFIGS, ['no_such_config_*.py'])
    stray = tmp_path / 'my_model.py'
    stray.write_text('model = dict()\n')
    with pytest.raises(ModelZooError, match='not a generated task config'):
        measure(str(stray))
    for argv in (['--out', str(tmp_path / 'zoo.txt')], ['--configs', 'no_such_*'], ['--stop-flops-at', '8h']):
        with pytest.raises(SystemExit):
            model_zoo.main(argv + ['--no-flops'])


def test_get_flops_counts_any_config_as_the_zoo_does(tmp_path, capsys):
    """tools/analysis/get_flops.py: a generated config gives the zoo's numbers; another input size, and a user
    config that is no generated one, are counted too."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        'get_flops', osp.join(osp.dirname(CONFIGS), 'tools', 'analysis', 'get_flops.py'))
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    name = 'fpn_shunted_t_80k_ade20k'
    result = tool.main([osp.join(CONFIGS, f'{name}.py')])
    with open(osp.join(osp.dirname(CONFIGS), 'docs', 'model_zoo.json')) as f:
        zoo = json.load(f)['configs'][name]
    counted = (result['params'], result['macs'], result['backbone_macs'])
    assert counted == (zoo['params'], zoo['macs'], zoo['backbone_macs'])
    assert f"{result['macs'] / 1e9:.2f} GFLOPs" in capsys.readouterr().out
    user = tmp_path / 'my_fpn.py'
    user.write_text(f"_base_ = [{osp.join(CONFIGS, name + '.py')!r}]\nmodel = dict(decode_head=dict(num_classes=3))\n")
    small = tool.main([str(user), '--shape', '256', '256'])
    assert small['input_hw'] == (256, 256) and small['macs'] < result['macs'] / 10
