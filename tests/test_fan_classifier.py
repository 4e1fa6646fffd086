"""FAN as an mmpretrain ImageClassifier: ``out_type='cls_token'`` (vit, hybrid) / ``'avg_featmap'`` (swin), no
neck and a ``LinearClsHead``, loaded from a file written by ``tools/model_converters/convert.py``, reproduces the
official logits of the parity fixtures."""
import importlib
import json
import runpy
import sys
from pathlib import Path

import pytest
import torch

from mmvisatt.models.backbones import FANSwin, FANViT
from mmvisatt.models.backbones.fan import form_classes

FORM_CLASSES = form_classes()

REPO = Path(__file__).parents[1]
DATA = REPO / 'tests' / 'data' / 'parity' / 'fan'
CONVERTER = REPO / 'tools' / 'model_converters' / 'convert.py'


def _classifier_backbone(meta: dict) -> dict:
    """The official constructor kwargs of a classifier fixture -> our FAN backbone config."""
    kw = meta['official_kwargs']
    if meta['official_class'] == 'SwinTransformer':
        arch = dict(form='swin', embed_dims=kw['embed_dim'], depths=kw['depths'], num_heads=kw['num_heads'],
                    channel_attn=[t != 'Mlp' for t in kw['mlp_type']])
        return dict(type='FANSwin', arch=arch, out_type='avg_featmap', window_size=kw['window_size'],
                    patch_size=kw['patch_size'])
    arch = dict(form='vit', embed_dims=kw['embed_dim'], depth=kw['depth'], num_heads=kw['num_heads'])
    if 'backbone' in kw:
        stem = kw['backbone']['kwargs']
        arch.update(form='hybrid', stem_depths=stem['depths'], stem_dims=stem['dims'])
    return dict(type=FORM_CLASSES[arch['form']].__name__, arch=arch, out_type='cls_token',
                cls_tokens_norm=kw['tokens_norm'], eta=kw['eta'], cls_attn_layers=kw['cls_attn_layers'])


def _head_channels(meta: dict) -> int:
    kw = meta['official_kwargs']
    return kw['embed_dim'] * 2 ** (len(kw['depths']) - 1) if 'depths' in kw else kw['embed_dim']


def _build_classifier(meta: dict):
    registry = importlib.import_module('mmpretrain.registry')
    from mmengine.registry import DefaultScope
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        return registry.MODELS.build(dict(
            type='ImageClassifier', backbone=_classifier_backbone(meta), neck=None,
            head=dict(type='LinearClsHead', num_classes=meta['num_classes'], in_channels=_head_channels(meta))))


def _convert_with_tool(src: Path, dst: Path, monkeypatch) -> None:
    monkeypatch.setattr(sys, 'argv', ['convert.py', str(src), str(dst)])
    runpy.run_path(str(CONVERTER), run_name='__main__')


@pytest.mark.parametrize('case', ['fan_vit_a', 'fan_hybrid_a', 'fan_swin_a'])
def test_converted_official_classifier_gives_official_logits(case, tmp_path, monkeypatch):
    from mmengine.runner import load_checkpoint
    meta = json.loads((DATA / case / 'meta.json').read_text())
    official = torch.load(DATA / case / 'state_dict.pth', weights_only=True)
    torch.save({'model': official}, tmp_path / 'official.pth')
    _convert_with_tool(tmp_path / 'official.pth', tmp_path / 'converted.pth', monkeypatch)

    model = _build_classifier(meta)
    converted = torch.load(tmp_path / 'converted.pth', weights_only=True)['state_dict']
    assert set(converted) == set(model.state_dict())  # nothing missing, nothing left over
    load_checkpoint(model, str(tmp_path / 'converted.pth'), map_location='cpu', strict=True)

    model.double().eval()
    images = torch.load(DATA / case / 'input.pt', weights_only=True).double()
    reference = torch.load(DATA / case / 'outputs.pt', weights_only=True)['logits']
    with torch.no_grad():
        feats = model.extract_feat(images)
        logits = model(images, mode='tensor')
    assert len(feats) == 1 and feats[0].shape == (images.shape[0], _head_channels(meta))
    assert logits.shape == reference.shape
    assert ((logits - reference).abs().max() / reference.abs().max()).item() < 1e-6


TINY = {
    'vit': dict(form='vit', embed_dims=32, depth=2, num_heads=2),
    'hybrid': dict(form='hybrid', embed_dims=32, depth=2, num_heads=2, stem_depths=(1, 1), stem_dims=(16, 24)),
    'swin': dict(form='swin', embed_dims=16, depths=(1, 1, 1, 1), num_heads=(1, 2, 2, 4)),
}


@pytest.mark.parametrize('form,out_type', [('vit', 'cls_token'), ('hybrid', 'cls_token'), ('swin', 'avg_featmap')])
def test_classifier_out_type_builds_only_the_official_classifier(form, out_type):
    """The dense extras (pyramid, stride-32 conv, output norms but Swin's final one) are not built even with the
    dense defaults of out_indices / out_norms, so no parameter stays without a gradient."""
    model = FORM_CLASSES[form](arch=TINY[form], out_type=out_type, out_indices=(0, 1, 2, 3), out_norms=True,
                               drop_path_rate=0.)
    names = {n.split('.')[0] for n, _ in model.named_parameters()}
    assert not names & {'pyramid', 'downsample', 'norm0', 'norm1', 'norm2'}
    assert ('norm3' in names) == (form == 'swin') and ('cls_norm' in names) == (form != 'swin')
    x = torch.randn(2, 3, 64, 48)
    out = model(x)
    assert len(out) == 1 and out[0].shape == (2, 128 if form == 'swin' else 32)
    out[0].sum().backward()
    no_grad = [n for n, p in model.named_parameters() if p.grad is None]
    assert not no_grad
    assert torch.allclose(out[0], model.forward_classifier(x))


def test_out_type_must_fit_the_form():
    with pytest.raises(ValueError, match="out_type 'avg_featmap' is not available for a vit FAN"):
        FANViT(arch=TINY['vit'], out_type='avg_featmap')
    with pytest.raises(ValueError, match="choose one of \\('featmap', 'avg_featmap'\\)"):
        FANSwin(arch=TINY['swin'], out_type='cls_token')
    with pytest.raises(RuntimeError, match='needs norm3'):
        FANSwin(arch=TINY['swin'], out_indices=(1, 2)).forward_classifier(torch.randn(1, 3, 32, 32))


# preset -> (official factory, head in_channels); the in_channels are what the imagenet_fan_* configs need
PRESETS = {
    'vit_t': ('fan_tiny_12_p16_224', 192), 'vit_s': ('fan_small_12_p16_224', 384),
    'vit_b': ('fan_base_18_p16_224', 448), 'vit_l': ('fan_large_24_p16_224', 480),
    'hybrid_t': ('fan_tiny_8_p4_hybrid', 192), 'hybrid_s': ('fan_small_12_p4_hybrid', 384),
    'hybrid_b': ('fan_base_16_p4_hybrid', 448), 'hybrid_l': ('fan_large_16_p4_hybrid', 480),
    **{f'swin_{s[0]}': (f'fan_swin_{s}_patch4_window7_224', c)
       for s, c in (('tiny', 768), ('small', 768), ('base', 1024), ('large', 1536))},
}


@pytest.mark.parametrize('preset', sorted(PRESETS))
def test_preset_classifiers_have_the_official_parameter_count(preset):
    official, channels = PRESETS[preset]
    counts = json.loads((DATA / 'param_counts.json').read_text())['classification'][official]
    registry = importlib.import_module('mmpretrain.registry')
    from mmengine.registry import DefaultScope
    out_type = 'avg_featmap' if preset.startswith('swin') else 'cls_token'
    with torch.device('meta'), DefaultScope.overwrite_default_scope('mmpretrain'):
        backbone = dict(type=FORM_CLASSES[preset.split('_')[0]].__name__, arch=preset, out_type=out_type)
        model = registry.MODELS.build(dict(
            type='ImageClassifier', backbone=backbone, neck=None,
            head=dict(type='LinearClsHead', num_classes=1000, in_channels=channels)))
    assert sum(p.numel() for p in model.parameters()) == counts['num_params']
