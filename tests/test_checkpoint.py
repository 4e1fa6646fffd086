"""Checkpoint layouts (official, timm, mmdet, mm-style) load through init_cfg; bad files raise clearly."""
import importlib
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mmvisatt.checkpoint import CheckpointMismatchError, convert_state_dict, unwrap_state_dict
from mmvisatt.models.backbones import ReSwinTransformer

ROOT = Path(__file__).parents[1]
FIXTURE = ROOT / 'tests/data/parity/revit/reswin_a/state_dict.pth'
TINY = dict(embed_dims=16, depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8))


@pytest.fixture(scope='module')
def official():
    return torch.load(FIXTURE, map_location='cpu', weights_only=True)


def _pretrained(path, **kwargs) -> ReSwinTransformer:
    model = ReSwinTransformer(arch=TINY, init_cfg=dict(type='Pretrained', checkpoint=str(path)), **kwargs)
    model.init_weights()
    return model


def _assert_weights_from_official(model, official):
    own = model.state_dict()
    assert torch.equal(own['stages.0.blocks.1.attn.qkv.weight'], official['layers.0.blocks.1.attn.qkv.weight'])
    # official patch merging sits at the end of stage i, ours at the start of stage i + 1
    assert torch.equal(own['stages.2.downsample.reduction.weight'],
                       official['layers.1.downsample.reduction.weight'])
    assert torch.equal(own['norm3.weight'], official['norm.weight'])


@pytest.mark.parametrize('wrap', ['model', 'model_state_dict', 'raw'])
def test_official_release_file(tmp_path, official, wrap, caplog):
    if wrap == 'raw':
        ckpt = official
    else:  # the ReViT training script saves a DDP model: 'module.' prefixes
        ckpt = {wrap: {f'module.{k}': v for k, v in official.items()}, 'epoch': 3}
    torch.save(ckpt, tmp_path / 'reswin.pth')
    model = _pretrained(tmp_path / 'reswin.pth')
    _assert_weights_from_official(model, official)


def test_load_report_names_new_and_ignored_keys(tmp_path, official):
    from mmvisatt.checkpoint import load_pretrained
    model = ReSwinTransformer(arch=TINY)
    report = load_pretrained(model, {'model': official}, family='reswin', allow_missing=model.not_in_pretrained)
    assert report.layout == 'official-swin'
    assert sorted(report.missing) == ['alpha', 'norm0.bias', 'norm0.weight', 'norm1.bias', 'norm1.weight',
                                      'norm2.bias', 'norm2.weight']
    assert 'head.fc.weight' not in report.unexpected  # heads are not offered to the backbone
    assert 'newly initialised' in report.summary()


def test_timm_layout(tmp_path):
    timm = importlib.import_module('timm')
    ref = timm.create_model('swin_tiny_patch4_window7_224', pretrained=False)
    torch.save(ref.state_dict(), tmp_path / 'timm.pth')
    model = ReSwinTransformer(arch='t', init_cfg=dict(type='Pretrained', checkpoint=str(tmp_path / 'timm.pth')))
    model.init_weights()
    assert torch.equal(model.state_dict()['stages.1.downsample.norm.weight'],
                       ref.state_dict()['layers.1.downsample.norm.weight'])


def test_mmdet_swin_layout_equals_mmdet_swin():
    mmdet_swin = importlib.import_module('mmdet.models.backbones.swin')
    torch.manual_seed(0)
    ref = mmdet_swin.SwinTransformer(embed_dims=16, depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8),
                                     window_size=7, drop_path_rate=0.).double()
    ref.eval()  # mmdet's Swin.train() returns None, so no chaining
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    converted, _, layout = convert_state_dict({f'backbone.{k}': v for k, v in ref.state_dict().items()})
    assert layout == 'mmdet-swin'
    model = ReSwinTransformer(arch=TINY).double().eval()
    from mmvisatt.checkpoint import load_into
    load_into(model, {k[9:]: v for k, v in converted.items() if k.startswith('backbone.')}, source='mmdet',
              layout=layout, allow_missing=['alpha'])
    with torch.no_grad():
        model.alpha.fill_(1.0)
        x = torch.randn(1, 3, 224, 224, dtype=torch.float64)
        theirs, ours = ref(x), model(x)
    # mmdet keeps shifting a map that fits one window (stage 4 at 224), Swin does not: compare stages 1-3
    for a, b in list(zip(ours, theirs))[:3]:
        assert ((a - b).abs().max() / b.abs().max()).item() < 1e-6


def test_converter_tool_roundtrip(tmp_path, official):
    torch.save({'model': official}, tmp_path / 'official.pth')
    out = tmp_path / 'converted' / 'reswin_mm.pth'
    result = subprocess.run([sys.executable, str(ROOT / 'tools/model_converters/convert.py'),
                             str(tmp_path / 'official.pth'), str(out)], capture_output=True, text=True, check=True)
    assert 'official-swin layout' in result.stdout
    saved = torch.load(out, map_location='cpu', weights_only=True)
    assert all(k.startswith(('backbone.', 'head.fc.')) for k in saved['state_dict'])
    assert 'head.fc.weight' in saved['state_dict']
    _assert_weights_from_official(_pretrained(out), official)


def test_wrong_files_raise(tmp_path, official):
    torch.save({'state_dict': {'conv1.weight': torch.zeros(8, 3, 7, 7), 'fc.weight': torch.zeros(10, 8)}},
               tmp_path / 'resnet.pth')
    with pytest.raises(CheckpointMismatchError, match='not recognised.*conv1.weight'):
        _pretrained(tmp_path / 'resnet.pth')

    truncated = {k: v for k, v in official.items() if not k.startswith('layers.3.')}
    torch.save(truncated, tmp_path / 'truncated.pth')
    with pytest.raises(CheckpointMismatchError, match=r'missing from the checkpoint: stages\.3\.blocks\.0'):
        _pretrained(tmp_path / 'truncated.pth')

    torch.save(official, tmp_path / 'tiny.pth')
    with pytest.raises(CheckpointMismatchError, match='another shape'):
        model = ReSwinTransformer(arch=dict(TINY, embed_dims=32),
                                  init_cfg=dict(type='Pretrained', checkpoint=str(tmp_path / 'tiny.pth')))
        model.init_weights()


def test_missing_file_says_how_to_pass_one(tmp_path):
    with pytest.raises(FileNotFoundError, match=r'--cfg-options model\.backbone\.init_cfg\.checkpoint=PATH'):
        _pretrained(tmp_path / 'nope.pth')


def test_relative_position_table_is_resized(tmp_path, official):
    torch.save(official, tmp_path / 'w7.pth')
    model = _pretrained(tmp_path / 'w7.pth', window_size=12)
    assert model.stages[0].blocks[0].attn.relative_position_bias_table.shape == (23 * 23, 1)


def test_unwrap_handles_nesting_and_prefix():
    sd = {'a': torch.zeros(1)}
    assert unwrap_state_dict({'model_state': {'module.a': sd['a']}}).keys() == {'a'}
    assert unwrap_state_dict({'state_dict': sd, 'meta': {}}).keys() == {'a'}
    # an EMA copy is taken only from a file that holds nothing else
    ema = {'b': sd['a']}
    assert unwrap_state_dict({'state_dict_ema': ema}).keys() == {'b'}
    assert unwrap_state_dict({'model': sd, 'model_ema': ema}).keys() == {'a'}


def test_a_deeper_variant_of_the_architecture_is_refused(tmp_path, official):
    # the reswin_a fixture has depths (2, 2, 2, 2): for a (2, 2, 1, 2) model it is what Swin-S is for Swin-T
    torch.save(official, tmp_path / 'deeper.pth')
    with pytest.raises(CheckpointMismatchError, match=r'13 tensors of blocks or stages the model does '
                                                      r'not have \(stages\.2\.blocks\.1\..*deeper variant'):
        model = ReSwinTransformer(arch=dict(TINY, depths=(2, 2, 1, 2)),
                                  init_cfg=dict(type='Pretrained', checkpoint=str(tmp_path / 'deeper.pth')))
        model.init_weights()


def _mmdet_swin_detector() -> dict:
    """A whole detector's state dict whose backbone is mmdet's Swin with the TINY arch."""
    mmdet_swin = importlib.import_module('mmdet.models.backbones.swin')
    torch.manual_seed(0)
    swin = mmdet_swin.SwinTransformer(embed_dims=16, depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8), window_size=7)
    state = {f'backbone.{k}': v for k, v in swin.state_dict().items()}
    return {**state, 'neck.lateral_convs.0.conv.weight': torch.ones(8, 16, 1, 1)}


def test_load_from_a_detector_with_an_mmdet_swin_backbone_converts_it():
    from types import SimpleNamespace

    from mmengine.config import Config

    from mmvisatt.engine import BackboneLayoutHook
    detector = _mmdet_swin_detector()
    model = torch.nn.Module()
    model.backbone = ReSwinTransformer(arch=TINY)
    checkpoint = {'state_dict': dict(detector)}
    runner = SimpleNamespace(model=model, cfg=Config(dict(load_from='swin_detector.pth')))
    BackboneLayoutHook().after_load_checkpoint(runner, checkpoint)
    state = checkpoint['state_dict']
    assert torch.equal(state['neck.lateral_convs.0.conv.weight'], detector['neck.lateral_convs.0.conv.weight'])
    result = model.load_state_dict(state, strict=False)
    assert list(result.missing_keys) == ['backbone.alpha'] and result.unexpected_keys == ['neck.lateral_convs.0.conv.'
                                                                                          'weight']
    assert torch.equal(model.backbone.state_dict()['stages.0.blocks.1.attn.qkv.weight'],
                       detector['backbone.stages.0.blocks.1.attn.w_msa.qkv.weight'])
    # a file of this backbone is left as it is
    own = {'state_dict': {f'backbone.{k}': v for k, v in model.backbone.state_dict().items()}}
    BackboneLayoutHook().after_load_checkpoint(runner, own)
    assert own['state_dict'].keys() == {f'backbone.{k}' for k in model.backbone.state_dict()}


def test_test_and_infer_name_a_detector_of_another_backbone_layout_and_where_it_converts():
    from mmvisatt.apis.inference import InferenceError, check_weights_fit
    model = torch.nn.Module()
    model.backbone = ReSwinTransformer(arch=TINY)
    with pytest.raises(InferenceError, match=r"does not fit .*Its backbone is in the mmdet-swin layout, another "
                                             r"model than this config's ReSwinTransformer.*load_from=PATH, which "
                                             r"converts the backbone \(reswin converter\)"):
        check_weights_fit(model, {'state_dict': _mmdet_swin_detector()})
    resnet = {'backbone.conv1.weight': torch.zeros(8, 3, 7, 7)}
    with pytest.raises(InferenceError) as error:
        check_weights_fit(model, resnet)
    assert 'layout' not in str(error.value)


def test_load_from_a_detector_with_an_unknown_backbone_is_refused():
    from types import SimpleNamespace

    from mmengine.config import Config

    from mmvisatt.engine import BackboneLayoutHook
    model = torch.nn.Module()
    model.backbone = ReSwinTransformer(arch=TINY)
    resnet = {'state_dict': {'backbone.conv1.weight': torch.zeros(8, 3, 7, 7), 'neck.conv.weight': torch.zeros(1)}}
    runner = SimpleNamespace(model=model, cfg=Config(dict(load_from='resnet_detector.pth')))
    with pytest.raises(CheckpointMismatchError, match=r'resnet_detector.pth: its backbone weights fit the model\'s '
                                                      r'backbone in 0 of .*would stay at its initialisation'):
        BackboneLayoutHook().after_load_checkpoint(runner, resnet)


def test_load_from_a_backbone_only_checkpoint_points_to_init_cfg(official):
    from types import SimpleNamespace

    from mmengine.config import Config

    from mmvisatt.engine import BackboneLayoutHook
    model = torch.nn.Module()
    model.backbone = ReSwinTransformer(arch=TINY)
    runner = SimpleNamespace(model=model, cfg=Config(dict(load_from='swin_imagenet.pth')))
    with pytest.raises(CheckpointMismatchError, match=r"swin_imagenet.pth has no 'backbone.' weights .*"
                                                      r"model.backbone.init_cfg.checkpoint=PATH"):
        BackboneLayoutHook().after_load_checkpoint(runner, {'state_dict': dict(official)})
