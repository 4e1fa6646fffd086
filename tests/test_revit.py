"""ReViT: equivalence with a timm ViT at alpha = 1, the simple pyramid, input sizes, checkpoints, registry."""
import importlib
import json
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from mmvisatt.checkpoint import (CheckpointMismatchError, convert_checkpoint_file, convert_state_dict, load_into,
                                 load_pretrained)
from mmvisatt.models.backbones import ReViT
from mmvisatt.testing import parity_model

DATA = Path(__file__).parent / 'data/parity/revit'
OFFICIAL = DATA / 'revit_a/state_dict.pth'
TINY = dict(embed_dims=32, depth=3, num_heads=4)
FIXTURE_ARCH = dict(embed_dims=96, depth=4, num_heads=4)  # the revit_a case


@pytest.fixture(scope='module')
def official():
    return torch.load(OFFICIAL, map_location='cpu', weights_only=True)


def _perturb(module: nn.Module) -> nn.Module:
    """No component close to identity (the parity fixtures' recipe)."""
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn_like(p) * (0.02 if p.dim() > 1 else 0.1))
    return module


def _timm_vit(**kwargs) -> nn.Module:
    from timm.models.vision_transformer import VisionTransformer
    # ReViT pools the mean token after the final norm: timm's 'avg' pooling without fc_norm
    return VisionTransformer(img_size=224, patch_size=16, embed_dim=TINY['embed_dims'], depth=TINY['depth'],
                             num_heads=TINY['num_heads'], num_classes=10, qkv_bias=True, **kwargs)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


def test_alpha_one_equals_timm_vit_without_class_token():
    torch.manual_seed(0)
    reference = _perturb(_timm_vit(class_token=False, global_pool='avg', fc_norm=False).double().eval())
    converted, family, layout = convert_state_dict(reference.state_dict())
    assert (family, layout) == ('revit', 'timm-vit')
    model = ReViT(arch=TINY).double().eval()
    load_into(model, {k[9:]: v for k, v in converted.items() if k.startswith('backbone.')}, source='timm',
              layout=layout, allow_missing=ReViT.not_in_pretrained)
    head = nn.Linear(32, 10).double()
    load_into(head, {k[8:]: v for k, v in converted.items() if k.startswith('head.fc.')}, source='timm',
              layout=layout)
    with torch.no_grad():
        model.alpha.fill_(1.0)
    x = torch.randn(2, 3, 224, 224, dtype=torch.float64)
    theirs, ours = [], []
    for block in reference.blocks:
        block.register_forward_hook(lambda m, a, out: theirs.append(out))
    for block in model.blocks:
        block.register_forward_hook(lambda m, a, out: ours.append(out[0].flatten(1, 2)))
    with torch.no_grad():
        logits = reference(x)
        mine = head(model(x)[2].mean(dim=(2, 3)))  # norm2 is the ViT's final norm
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert _rel(a, b) < 1e-6, f'block {i}'
    assert _rel(mine, logits) < 1e-6
    # with the residual active it is no longer the plain ViT
    with torch.no_grad():
        model.alpha.fill_(0.3)
        ours.clear()
        model(x)
    assert _rel(ours[-1], theirs[-1]) > 1e-4


def test_parity_fixture_detects_a_dropped_residual():
    """The revit_a fixture is sensitive to the residual path: without it parity breaks (the test can fail)."""
    case = DATA / 'revit_a'
    meta = json.loads((case / 'meta.json').read_text())
    model = parity_model(meta, torch.load(case / 'state_dict.pth', weights_only=True)).double()
    ref = torch.load(case / 'outputs.pt', weights_only=True)
    for module in model.modules():
        if hasattr(module, 'align'):
            module.align = lambda *args: None  # residual_attention then keeps the layer's own scores
    with torch.no_grad():
        out = model(torch.load(case / 'input.pt', weights_only=True).double())
    assert _rel(out['stages'][-1], ref['stages'][-1]) > 1e-4


def _expected_sizes(h: int, w: int):
    return [(-(-h // s), -(-w // s)) for s in (4, 8, 16, 32)]


@pytest.mark.parametrize('out_indices', [(0, 1, 2, 3), (0, ), (1, ), (2, ), (3, ), (1, 3)])
def test_any_input_size(out_indices):
    model = ReViT(arch=TINY, out_indices=out_indices).eval()
    with torch.no_grad():
        outs = model(torch.randn(1, 3, 333, 517))
    assert len(outs) == len(out_indices)
    sizes = _expected_sizes(333, 517)
    for out, i in zip(outs, out_indices):
        assert tuple(out.shape) == (1, model.num_features[i], *sizes[i])
        assert torch.isfinite(out).all()
    assert model.num_features == [8, 16, 32, 32]


def test_pyramid_feeds_a_standard_fpn():
    fpn_module = importlib.import_module('mmdet.models.necks')
    model = ReViT(arch=TINY).eval()
    fpn = fpn_module.FPN(in_channels=model.num_features, out_channels=16, num_outs=5)
    with torch.no_grad():
        outs = fpn(model(torch.randn(1, 3, 96, 160)))
    assert [tuple(o.shape[-2:]) for o in outs] == [(24, 40), (12, 20), (6, 10), (3, 5), (2, 3)]


def test_position_embedding_is_interpolated_like_a_resized_checkpoint(official):
    """A 224-model on 448 px inputs bicubically resizes its 14x14 grid; loading into a 448-model does the same."""
    torch.manual_seed(0)
    small = ReViT(arch=FIXTURE_ARCH, out_indices=(2, )).double().eval()
    large = ReViT(arch=FIXTURE_ARCH, img_size=448, out_indices=(2, )).double().eval()
    for model in (small, large):
        load_pretrained(model, official, family='revit', allow_missing=ReViT.not_in_pretrained)
    assert large.pos_embed.shape == (1, 28 * 28, 96)
    x = torch.randn(1, 3, 448, 448, dtype=torch.float64)
    with torch.no_grad():
        assert _rel(small(x)[0], large(x)[0]) < 1e-6


def test_parameter_count_matches_official():
    counts = json.loads((DATA / 'param_counts.json').read_text())['variants']['ReViT-B']
    with torch.device('meta'):
        backbone = ReViT(arch='b', out_indices=(2, ))  # the classifier's features: stride 16, final norm
        head = nn.Linear(768, 1000)
    total = sum(p.numel() for p in backbone.parameters()) + sum(p.numel() for p in head.parameters())
    assert total == counts['num_params'] == 86_566_121
    assert len(backbone.state_dict()) + 2 == counts['state_dict_keys']


def test_arch_presets_and_input_errors():
    for arch in ('b', 'revit_b', 'base', 'ReViT-B'):
        with torch.device('meta'):
            model = ReViT(arch=arch, out_indices=(2, ))
        assert len(model.blocks) == 12 and model.pos_embed.shape == (1, 196, 768)
    with pytest.raises(ValueError, match=r"Unknown ReViT arch 'x'.*\['b'\]"):
        ReViT(arch='x')
    with pytest.raises(ValueError, match='arch dict needs'):
        ReViT(arch=dict(embed_dims=32))
    model = ReViT(arch=TINY)
    with pytest.raises(ValueError, match=r'expects images of shape \(B, 3, H, W\).*in_channels=1'):
        model(torch.randn(1, 1, 64, 64))
    with pytest.raises(ValueError, match='at least 16x16 pixels'):
        model(torch.randn(1, 3, 8, 64))
    with pytest.raises(ValueError, match='out_indices'):
        ReViT(arch=TINY, out_indices=(4, ))


def test_frozen_stages_and_norm_eval():
    model = ReViT(arch=TINY, frozen_stages=2, norm_eval=True)
    model.train()
    assert not model.pos_embed.requires_grad and not model.patch_embed.proj.weight.requires_grad
    assert not any(p.requires_grad for p in model.blocks[1].parameters())
    assert all(p.requires_grad for p in model.blocks[2].parameters())
    assert not model.alpha.requires_grad and model.pyramid.up2.weight.requires_grad
    assert not model.blocks[0].training and model.blocks[2].training
    assert not model.norm0.training  # norm_eval
    model = ReViT(arch=TINY, frozen_stages=0)
    assert model.alpha.requires_grad and not model.pos_embed.requires_grad
    assert [n for n, p in ReViT(arch=TINY).named_parameters() if p.numel() == 1] == ['alpha']
    assert ReViT(arch=TINY, learnable_alpha=False).alpha == 0.5


# ------------------------------------------------------------------------------------------------ checkpoints
def _pretrained(path, **kwargs) -> ReViT:
    model = ReViT(arch=FIXTURE_ARCH, init_cfg=dict(type='Pretrained', checkpoint=str(path)), **kwargs)
    model.init_weights()
    return model


@pytest.mark.parametrize('wrap', ['model_state_dict', 'model', 'raw'])
def test_official_release_file(tmp_path, official, wrap):
    # the official training script saves a DDP model under 'model_state_dict'; the notebook reads 'model'
    ckpt = official if wrap == 'raw' else {wrap: {f'module.{k}': v for k, v in official.items()}, 'epoch': 299}
    torch.save(ckpt, tmp_path / 'revit.pth')
    own = _pretrained(tmp_path / 'revit.pth').state_dict()
    assert torch.equal(own['blocks.3.attn.qkv.weight'], official['blocks.3.attn.qkv.weight'])
    assert torch.equal(own['norm2.weight'], official['norm.weight'])
    assert torch.equal(own['alpha'], official['alpha']) and own['alpha'].item() == pytest.approx(0.3)


def test_load_report_names_new_keys(official):
    model = ReViT(arch=FIXTURE_ARCH)
    report = load_pretrained(model, {'model': official}, family='revit', allow_missing=model.not_in_pretrained)
    assert report.layout == 'official-revit'
    assert all(k.startswith(('norm0.', 'norm1.', 'norm3.', 'pyramid.')) for k in report.missing)
    assert 'pyramid.up4.0.weight' in report.missing and not report.unexpected


def test_timm_vit_layout_drops_the_class_token(tmp_path):
    reference = _timm_vit()  # timm's default: a class token and a (1, 197, C) position embedding
    sd = reference.state_dict()
    assert sd['pos_embed'].shape == (1, 197, 32)
    torch.save(sd, tmp_path / 'timm.pth')
    model = ReViT(arch=TINY, init_cfg=dict(type='Pretrained', checkpoint=str(tmp_path / 'timm.pth')))
    model.init_weights()
    assert torch.equal(model.pos_embed, sd['pos_embed'][:, 1:])
    assert torch.equal(model.norm2.bias, sd['norm.bias'])
    assert model.alpha.item() == 0.5  # new: keeps its initial value
    converted, _, layout = convert_state_dict(sd, 'revit')
    assert layout == 'timm-vit' and 'head.fc.weight' in converted and 'backbone.cls_token' not in converted


def test_mm_style_roundtrip(tmp_path, official):
    torch.save({'model_state_dict': official}, tmp_path / 'official.pth')
    family, layout, _ = convert_checkpoint_file(str(tmp_path / 'official.pth'), str(tmp_path / 'mm.pth'))
    assert (family, layout) == ('revit', 'official-revit')
    saved = torch.load(tmp_path / 'mm.pth', map_location='cpu', weights_only=True)['state_dict']
    assert set(k.split('.')[0] for k in saved) == {'backbone', 'head'} and 'head.fc.weight' in saved
    assert convert_state_dict(saved)[1:] == ('revit', 'mmvisatt')
    model = _pretrained(tmp_path / 'mm.pth')
    assert torch.equal(model.state_dict()['blocks.0.mlp.fc1.weight'], official['blocks.0.mlp.fc1.weight'])


def test_wrong_files_raise(tmp_path, official):
    swin = torch.load(DATA / 'reswin_a/state_dict.pth', map_location='cpu', weights_only=True)
    torch.save(swin, tmp_path / 'swin.pth')
    with pytest.raises(CheckpointMismatchError, match='not recognised as revit'):
        _pretrained(tmp_path / 'swin.pth')
    mvit = torch.load(DATA / 'remvit_a/state_dict.pth', map_location='cpu', weights_only=True)
    torch.save(mvit, tmp_path / 'mvit.pth')
    with pytest.raises(CheckpointMismatchError, match='not recognised as revit'):
        _pretrained(tmp_path / 'mvit.pth')
    torch.save({k: v for k, v in official.items() if not k.startswith('blocks.3.')}, tmp_path / 'short.pth')
    with pytest.raises(CheckpointMismatchError, match=r'missing from the checkpoint: blocks\.3\.'):
        _pretrained(tmp_path / 'short.pth')
    torch.save(official, tmp_path / 'narrow.pth')
    with pytest.raises(CheckpointMismatchError, match='another shape'):
        ReViT(arch=dict(FIXTURE_ARCH, embed_dims=64),
              init_cfg=dict(type='Pretrained', checkpoint=str(tmp_path / 'narrow.pth'))).init_weights()
