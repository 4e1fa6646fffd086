"""FAN: presets and parameter counts, the channel attention against its formula, fused == explicit attention,
input sizes, quirk switches, checkpoints (official layouts, wrappers, mm-style files), freezing and errors."""
import importlib
import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from timm.layers import LayerNorm2d

from mmvisatt.checkpoint import (CheckpointMismatchError, convert_checkpoint_file, convert_state_dict,
                                 load_pretrained)
from mmvisatt.models.backbones import FANSwin, FANViT
from mmvisatt.models.backbones.fan import FAN, FANBase, FourierPositionEncoding, form_classes
from mmvisatt.models.backbones.fan_hybrid import UnbiasedLayerNorm2d
from mmvisatt.models.layers.attention import attention
from mmvisatt.models.backbones.fan import EfficientChannelAttention, TokenAttention, channel_gate
from mmvisatt.testing import parity_model

DATA = Path(__file__).parent / 'data/parity/fan'
TINY = {
    'vit': dict(form='vit', embed_dims=32, depth=2, num_heads=2),
    'hybrid': dict(form='hybrid', embed_dims=32, depth=3, num_heads=2, stem_depths=(1, 1), stem_dims=(16, 24),
                   out_block=1, down_channels=40),
    'swin': dict(form='swin', embed_dims=16, depths=(1, 2, 1, 1), num_heads=(1, 2, 2, 4)),
}
# the shared fixtures' architectures (official kwargs in meta.json)
FIXTURE = {
    'fan_vit_a': dict(form='vit', embed_dims=96, depth=3, num_heads=4),
    'fan_hybrid_a': dict(form='hybrid', embed_dims=96, depth=2, num_heads=4, stem_depths=(3, 3),
                         stem_dims=(32, 64)),
    'fan_swin_a': dict(form='swin', embed_dims=24, depths=(1, 1, 2, 1), num_heads=(2, 4, 8, 16)),
}


def _fan(arch, **kwargs) -> FANBase:
    """The FAN form class ``arch`` names, built (what a config's type='FANViT' / 'FANHybrid' / 'FANSwin' does)."""
    return form_classes()[FANBase._resolve_form(arch, None)['form']](arch=arch, **kwargs)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


def _official(case: str) -> dict:
    return torch.load(DATA / case / 'state_dict.pth', map_location='cpu', weights_only=True)


def _case(case: str):
    meta = json.loads((DATA / case / 'meta.json').read_text())
    images = torch.load(DATA / case / 'input.pt', weights_only=True).double()
    return meta, images, torch.load(DATA / case / 'outputs.pt', weights_only=True)


# ------------------------------------------------------------------------------------------------ presets
OFFICIAL_NAMES = {
    'vit_t': 'fan_tiny_12_p16_224', 'vit_s': 'fan_small_12_p16_224', 'vit_b': 'fan_base_18_p16_224',
    'vit_l': 'fan_large_24_p16_224', 'hybrid_t': 'fan_tiny_8_p4_hybrid', 'hybrid_s': 'fan_small_12_p4_hybrid',
    'hybrid_b': 'fan_base_16_p4_hybrid', 'hybrid_l': 'fan_large_16_p4_hybrid',
    'swin_t': 'fan_swin_tiny_patch4_window7_224', 'swin_s': 'fan_swin_small_patch4_window7_224',
    'swin_b': 'fan_swin_base_patch4_window7_224', 'swin_l': 'fan_swin_large_patch4_window7_224',
}
DETECTION_NAMES = {'hybrid_t': 'fan_tiny_8_p4_hybrid', 'hybrid_s': 'fan_small_12_p4_hybrid',
                   'hybrid_b': 'fan_base_12_p4_hybrid', 'hybrid_l': 'fan_large_12_p4_hybrid'}


def _count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize('preset', sorted(OFFICIAL_NAMES))
def test_classifier_parameter_counts_match_official(preset):
    counts = json.loads((DATA / 'param_counts.json').read_text())['classification'][OFFICIAL_NAMES[preset]]
    with torch.device('meta'):
        if preset.startswith('swin'):
            # norm3 is the official final norm; the other output norms are dense-task extras
            backbone = FANSwin(arch=f'fan_{preset}', out_indices=(3, ))
        else:
            backbone = _fan(f'fan_{preset}', classifier=True, out_norms=False,
                            out_indices=(0, 1, 2) if preset.startswith('hybrid') else (2, ))
        head = nn.Linear(backbone.num_features[-1] if preset.startswith('swin') else backbone.arch['embed_dims'],
                         1000)
    assert _count(backbone) + _count(head) == counts['num_params']
    keys = len(backbone.state_dict()) + 2
    if preset.startswith('swin'):
        # the official state dict also holds relative_position_index per block and attn_mask per shifted block
        # (none in the last stage, whose 7x7 map fits one window)
        depths = backbone.arch['depths']
        keys += sum(depths) + sum(d // 2 for d in depths[:3])
    assert keys == counts['state_dict_keys']
    # the official name and the short name give the same preset
    assert FANBase._resolve_arch(OFFICIAL_NAMES[preset]) == FANBase._resolve_arch(preset)


@pytest.mark.parametrize('preset', sorted(DETECTION_NAMES))
def test_detection_backbone_parameter_counts_match_official(preset):
    counts = json.loads((DATA / 'param_counts.json').read_text())['detection_backbones'][DETECTION_NAMES[preset]]
    with torch.device('meta'):
        backbone = _fan(preset, out_norms=False)
    assert _count(backbone) == counts['num_params']
    assert len(backbone.state_dict()) == counts['state_dict_keys']
    assert backbone.out_block == counts['out_index']
    assert backbone.num_features == [128, 256, counts['embed_dim'], 768]


def test_arch_names_and_form_argument():
    assert FANBase._resolve_form('s', 'hybrid') == FANBase.arch_zoo['hybrid_s']
    assert FANBase._resolve_form('fan_swin_small', None) == FANBase.arch_zoo['swin_s']
    assert FANBase._resolve_form('FAN-ViT-B', 'vit') == FANBase.arch_zoo['vit_b']
    assert FANBase._resolve_form('fan_small_12_p4_hybrid', 'hybrid') == FANBase.arch_zoo['hybrid_s']
    assert FANBase._resolve_form({k: v for k, v in TINY['vit'].items() if k != 'form'}, 'vit') == TINY['vit']
    with pytest.raises(ValueError, match="Unknown FAN arch 't'"):
        FAN(arch='t')
    with pytest.raises(ValueError, match="form must be one of"):
        FAN(arch='t', form='convnext')
    with pytest.raises(ValueError, match="arch is a vit FAN but form='swin'"):
        FAN(arch='vit_t', form='swin')
    with pytest.raises(ValueError, match=r"needs \['stem_depths', 'stem_dims'\]"):
        FAN(arch=dict(form='hybrid', embed_dims=32, depth=2, num_heads=2))
    with pytest.raises(ValueError, match='out_indices'):
        _fan(TINY['vit'], out_indices=(4, ))


# ------------------------------------------------------------------------------------------- attention
def test_channel_gate_equals_its_formula_on_a_hand_made_input():
    """Two heads of two channels over four tokens, the formula evaluated with plain floats."""
    x = torch.tensor([[[0.5, -1.0, 2.0, 0.0], [1.5, 0.3, -0.7, 1.0], [-0.2, 0.8, 0.1, -1.5],
                       [0.9, -0.4, 1.2, 0.6]]], dtype=torch.float64)
    eca = EfficientChannelAttention(4, num_heads=2, hidden_dim=8).double()
    with torch.no_grad():
        eca.q.weight.copy_(torch.tensor([[1., 0, 0, 0], [0, 2, 0, 0], [0, 0, -1, 0], [1, 0, 0, 1]]))
        eca.q.bias.copy_(torch.tensor([0.1, 0., -0.2, 0.3]))
        eca.temperature.copy_(torch.tensor([2.0, 0.5]).view(2, 1, 1))
    rows = x[0].tolist()
    q = [[sum(eca.q.weight[c, j].item() * r[j] for j in range(4)) + eca.q.bias[c].item() for c in range(4)]
         for r in rows]

    def softmax_over_tokens(m, c):
        z = sum(math.exp(m[n][c]) for n in range(4))
        return [math.exp(m[n][c]) / z for n in range(4)]

    expected = []
    for c in range(4):
        head = c // 2
        q_hat = softmax_over_tokens(q, c)
        k_hat = [softmax_over_tokens(rows, c2) for c2 in (2 * head, 2 * head + 1)]
        prototype = [(k_hat[0][n] + k_hat[1][n]) / 2 for n in range(4)]
        logit = sum(q_hat[n] * prototype[n] for n in range(4))
        expected.append([2.0, 0.5][head] / (1 + math.exp(-logit)))
    gate = eca.gate(x)
    assert gate.shape == (1, 1, 4)
    assert torch.allclose(gate[0, 0], torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-14)
    assert torch.allclose(channel_gate(eca.q(x), x, 2).flatten(1) * torch.tensor([2., 2., .5, .5]),
                          gate[:, 0], rtol=0, atol=1e-14)
    # the output is the normalised value branch scaled channel by channel, the same gate for every token
    value = eca.norm_v(eca.mlp_v(x, (2, 2)))
    assert torch.allclose(eca(x, (2, 2)), value * torch.tensor(expected, dtype=torch.float64), atol=1e-14)


def test_value_branch_residual_switch():
    torch.manual_seed(0)
    x = torch.randn(2, 6, 8, dtype=torch.float64)
    with_id = EfficientChannelAttention(8, 2, 16, value_residual=True).double().eval()
    without = EfficientChannelAttention(8, 2, 16, value_residual=False).double().eval()
    without.load_state_dict(with_id.state_dict())
    mlp = with_id.mlp_v
    a = mlp.fc1(x)
    assert torch.allclose(with_id.mlp_v(x, (2, 3)) - without.mlp_v(x, (2, 3)), mlp.fc2(a) - mlp.fc2.bias,
                          atol=1e-12)


def test_fused_attention_equals_explicit_in_float64():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, n, 8, dtype=torch.float64) for n in (5, 7, 7))
    bias = torch.randn(3, 5, 7, dtype=torch.float64)
    for b in (None, bias):
        fused = attention(q, k, v, b, fused=True)
        assert torch.allclose(fused, attention(q, k, v, b, fused=False), atol=1e-13)
    attn = TokenAttention(16, 4).double()
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    ref = attn(x)
    attn.fused = False
    assert torch.allclose(attn(x), ref, atol=1e-13)


@pytest.mark.parametrize('form', sorted(TINY))
def test_fused_and_explicit_backbones_agree(form):
    torch.manual_seed(0)
    head = {} if form == 'swin' else dict(classifier=True)  # the token forms' class-attention head too
    fused = _fan(TINY[form], drop_path_rate=0., **head).double().eval()
    fused.init_weights()
    explicit = _fan(TINY[form], drop_path_rate=0., fused_attn=False, **head).double().eval()
    explicit.load_state_dict(fused.state_dict())
    x = torch.randn(1, 3, 75, 90, dtype=torch.float64)
    with torch.no_grad():
        for a, b in zip(fused(x), explicit(x)):
            assert _rel(a, b) < 1e-12
        assert _rel(fused.forward_classifier(x), explicit.forward_classifier(x)) < 1e-12


# ----------------------------------------------------------------------------------------- input sizes
def test_num_features_per_form():
    assert _fan(TINY['vit']).num_features == [8, 16, 32, 32]
    assert _fan(TINY['hybrid']).num_features == [16, 24, 32, 40]
    assert _fan(TINY['swin']).num_features == [16, 32, 64, 128]


def test_hybrid_dense_outputs_feed_a_standard_fpn():
    fpn_module = importlib.import_module('mmdet.models.necks')
    model = _fan(TINY['hybrid']).eval()
    fpn = fpn_module.FPN(in_channels=model.num_features, out_channels=16, num_outs=5)
    with torch.no_grad():
        outs = fpn(model(torch.randn(1, 3, 96, 160)))
    assert [tuple(o.shape[-2:]) for o in outs] == [(24, 40), (12, 20), (6, 10), (3, 5), (2, 3)]


def test_segmentation_layout_ends_at_stride_16():
    """``feat_downsample=False`` (the official segmentation backbone): the fourth level is the class-attention
    patch tokens themselves at stride 16, without the detection layout's stride-32 conv; the other levels and the
    tokens are those of the detection layout with the same weights."""
    torch.manual_seed(0)
    det = _fan(TINY['hybrid'], out_norms=False).eval()
    seg = _fan(TINY['hybrid'], out_norms=False, feat_downsample=False).eval()
    assert seg.num_features == [16, 24, 32, 32] and seg.strides == (4, 8, 16, 16)
    assert not hasattr(seg, 'downsample')
    assert set(det.state_dict()) - set(seg.state_dict()) == {'downsample.weight', 'downsample.bias'}
    seg.load_state_dict({k: v for k, v in det.state_dict().items() if not k.startswith('downsample.')})
    x = torch.randn(1, 3, 100, 150)
    with torch.no_grad():
        det_out, seg_out = det(x), seg(x)
    assert [tuple(o.shape[1:]) for o in seg_out] == [(16, 25, 38), (24, 13, 19), (32, 7, 10), (32, 7, 10)]
    assert all(torch.equal(a, b) for a, b in zip(det_out[:3], seg_out[:3]))
    assert torch.allclose(det.downsample(seg_out[3]), det_out[3], atol=1e-5)
    with pytest.raises(TypeError, match="unexpected keyword argument 'feat_downsample'"):
        FANViT(arch=TINY['vit'], feat_downsample=False)
    with pytest.raises(ValueError, match='hybrid form only'):  # the deprecated builder says which form has it
        FAN(arch=TINY['vit'], feat_downsample=False)


def test_bad_inputs_raise():
    for form, smallest in (('vit', 16), ('hybrid', 16), ('swin', 4)):
        model = _fan(TINY[form]).eval()
        with pytest.raises(ValueError, match=r'expects images of shape \(B, 3, H, W\).*in_channels=1'):
            model(torch.randn(1, 1, 64, 64))
        with pytest.raises(ValueError, match=f'at least {smallest}x{smallest} pixels'):
            model(torch.randn(1, 3, smallest - 1, 64))
    with pytest.raises(RuntimeError, match='classifier=True'):
        _fan(TINY['vit']).forward_classifier(torch.randn(1, 3, 32, 32))


# --------------------------------------------------------------------------------------------- training
def test_frozen_stages_and_norm_eval():
    model = _fan(TINY['hybrid'], frozen_stages=2, norm_eval=True)
    model.train()
    assert not any(p.requires_grad for p in model.patch_embed.parameters())
    assert not any(p.requires_grad for p in model.pos_embed.parameters())
    assert not any(p.requires_grad for p in model.blocks[1].parameters())
    assert all(p.requires_grad for p in model.blocks[2].parameters())
    assert not model.blocks[0].training and model.blocks[2].training
    assert not model.blocks[2].channel_attn.mlp_v.dwconv.bn.training  # norm_eval
    swin = _fan(TINY['swin'], frozen_stages=1)
    swin.train()
    assert not any(p.requires_grad for p in swin.stages[0].parameters()) and not swin.norm0.weight.requires_grad
    assert all(p.requires_grad for p in swin.stages[1].parameters()) and swin.norm1.training


# ------------------------------------------------------------------------------------------ quirks
def test_layernorm2d_variance_switch():
    torch.manual_seed(0)
    x = torch.randn(2, 5, 3, 4, dtype=torch.float64)
    biased, unbiased = LayerNorm2d(5).double(), UnbiasedLayerNorm2d(5).double()
    mean = x.mean(dim=1, keepdim=True)
    var = ((x - mean) ** 2).sum(dim=1, keepdim=True)
    assert torch.allclose(biased(x), (x - mean) / torch.sqrt(var / 5 + 1e-6), atol=1e-12)
    assert torch.allclose(unbiased(x), (x - mean) / torch.sqrt(var / 4 + 1e-6), atol=1e-12)


def test_unbiased_stem_norms():
    official = _fan(TINY['hybrid'])
    norms = [m for m in official.patch_embed.modules() if isinstance(m, LayerNorm2d)]
    # the stem's norm sees contiguous input officially; every later one took the unbiased fallback
    assert [isinstance(m, UnbiasedLayerNorm2d) for m in norms] == [False] + [True] * (len(norms) - 1)


def test_fixture_needs_the_unbiased_norms_and_the_detection_frequencies():
    """Turning either quirk off breaks parity with the official outputs (so the switches matter)."""
    meta, images, ref = _case('fan_det_a')
    model = parity_model(meta, _official('fan_det_a')).double()
    with torch.no_grad():
        assert _rel(model(images)['stages'][2], ref['stages'][2]) < 1e-6
        model.backbone.pos_embed.exponent = 'paired'
        assert _rel(model(images)['stages'][2], ref['stages'][2]) > 1e-2
        model.backbone.pos_embed.exponent = 'linear'
        for m in model.backbone.modules():
            if isinstance(m, UnbiasedLayerNorm2d):
                m.forward = LayerNorm2d.forward.__get__(m)
        assert _rel(model(images)['stages'][1], ref['stages'][1]) > 1e-3


def test_parity_builder_maps_kwargs_generally_and_refuses_what_it_cannot_build():
    meta, images, ref = _case('fan_vit_a')
    other = dict(meta, official_kwargs=dict(meta['official_kwargs'], num_heads=[4, 4, 4], tokens_norm=False))
    model = parity_model(other, _official('fan_vit_a')).double()
    assert not model.backbone.cls_attn_blocks[0].tokens_norm
    with torch.no_grad():
        assert _rel(model(images)['stages'][1], ref['stages'][1]) < 1e-6  # blocks come before class attention
        assert _rel(model(images)['logits'], ref['logits']) > 1e-6
    for change in (dict(se_mlp=True), dict(num_heads=[4, 4, 8]), dict(patch_size=8), dict(use_pos_embed=False)):
        bad = dict(meta, official_kwargs=dict(meta['official_kwargs'], **change))
        with pytest.raises(ValueError):
            parity_model(bad, _official('fan_vit_a'))


def test_fourier_encoding_grid_is_float32_and_frequencies_differ_by_exponent():
    paired = FourierPositionEncoding(8).double()
    linear = FourierPositionEncoding(8, exponent='linear').double()
    linear.load_state_dict(paired.state_dict())
    grids = []
    paired.proj.register_forward_pre_hook(lambda m, args: grids.append(args[0]))
    out = paired((3, 5))
    assert out.shape == (1, 15, 8) and out.dtype == torch.float64
    grid = grids[0][0]
    # built in float32 and cast: the values are exactly float32 numbers
    assert torch.equal(grid, grid.float().double())
    # slot 0 of the y-block is sin(2*pi*y / (H + 1e-6)), slot 1 its cosine at the same frequency when paired
    y = torch.arange(1, 4, dtype=torch.float64) / (3 + 1e-6) * 2 * math.pi
    assert torch.allclose(grid[0, :, 0], y.sin(), atol=1e-6) and torch.allclose(grid[1, :, 0], y.cos(), atol=1e-6)
    assert not torch.allclose(paired((3, 5)), linear((3, 5)))
    with pytest.raises(ValueError, match='exponent'):
        FourierPositionEncoding(8, exponent='log')


# ----------------------------------------------------------------------------------------- checkpoints
def _pretrained(path, arch, **kwargs) -> FAN:
    model = _fan(arch, init_cfg=dict(type='Pretrained', checkpoint=str(path)), **kwargs)
    model.init_weights()
    return model


@pytest.mark.parametrize('wrap', ['raw', 'model', 'state_dict', 'state_dict_and_ema'])
def test_official_classifier_file_loads_through_init_cfg(tmp_path, wrap):
    official = _official('fan_vit_a')
    if wrap == 'raw':
        ckpt = official
    elif wrap == 'state_dict_and_ema':
        # timm training checkpoints: the plain weights under 'state_dict' are read
        ckpt = {'state_dict': official, 'state_dict_ema': {k: v + 1 for k, v in official.items()}, 'epoch': 299}
    else:
        ckpt = {wrap: {f'module.{k}': v for k, v in official.items()}}
    torch.save(ckpt, tmp_path / 'fan.pth')
    model = _pretrained(tmp_path / 'fan.pth', FIXTURE['fan_vit_a'], classifier=True)
    own = model.state_dict()
    assert torch.equal(own['blocks.2.channel_attn.mlp_v.fc1.weight'], official['blocks.2.mlp.mlp_v.fc1.weight'])
    assert torch.equal(own['blocks.1.channel_attn.temperature'], official['blocks.1.mlp.temperature'])
    assert torch.equal(own['pos_embed.proj.weight'], official['pos_embed.token_projection.weight'])
    assert torch.equal(own['cls_norm.bias'], official['norm.bias'])
    assert torch.equal(own['patch_embed.proj.6.1.running_var'], official['patch_embed.proj.6.1.running_var'])


def test_classifier_checkpoint_into_dense_hybrid_reports_new_keys():
    official = _official('fan_hybrid_a')
    model = _fan(FIXTURE['fan_hybrid_a'])
    report = load_pretrained(model, {'model': official}, family='fan', allow_missing=model.not_in_pretrained)
    assert report.layout == 'official-fan'
    assert sorted({k.split('.')[0] for k in report.missing}) == ['downsample', 'norm0', 'norm1', 'norm2', 'norm3']
    assert report.unexpected == ['cls_norm.weight', 'cls_norm.bias']
    assert torch.equal(model.state_dict()['patch_embed.stages.1.downsample.1.weight'],
                       official['patch_embed.backbone.stages.1.downsample.1.weight'])


def test_official_detection_backbone_loads_completely():
    official = _official('fan_det_a')
    arch = dict(form='hybrid', embed_dims=64, depth=3, num_heads=4, stem_depths=(2, 2), stem_dims=(32, 64),
                out_block=1)
    model = _fan(arch, out_norms=False, pos_exponent='linear')
    report = load_pretrained(model, official, family='fan', allow_missing=())
    assert not report.missing and not report.unexpected
    assert torch.equal(model.downsample.weight, official['learnable_downsample.weight'])


def test_official_swin_file_drops_rebuilt_buffers(tmp_path):
    official = _official('fan_swin_a')
    torch.save({'model': official}, tmp_path / 'swin.pth')
    model = _pretrained(tmp_path / 'swin.pth', FIXTURE['fan_swin_a'])
    own = model.state_dict()
    assert torch.equal(own['stages.1.downsample.reduction.weight'], official['layers.0.downsample.reduction.weight'])
    assert torch.equal(own['stages.2.blocks.1.channel_attn.q.weight'], official['layers.2.blocks.1.mlp.q.weight'])
    assert torch.equal(own['stages.3.blocks.0.mlp.fc1.weight'], official['layers.3.blocks.0.mlp.fc1.weight'])
    assert torch.equal(own['norm3.weight'], official['norm.weight'])
    converted, family, layout = convert_state_dict(official)
    assert (family, layout) == ('fan', 'official-fan-swin') and 'head.fc.weight' in converted
    assert not any(k.endswith(('attn_mask', 'relative_position_index')) for k in converted)


@pytest.mark.parametrize('case', ['fan_vit_a', 'fan_swin_a'])
def test_mm_style_roundtrip_keeps_the_outputs(tmp_path, case):
    meta, images, ref = _case(case)
    official = _official(case)
    torch.save(official, tmp_path / 'official.pth')
    family, layout, _ = convert_checkpoint_file(str(tmp_path / 'official.pth'), str(tmp_path / 'mm.pth'))
    assert family == 'fan' and layout.startswith('official-fan')
    saved = torch.load(tmp_path / 'mm.pth', map_location='cpu', weights_only=True)['state_dict']
    assert {k.split('.')[0] for k in saved} == {'backbone', 'head'} and 'head.fc.weight' in saved
    assert convert_state_dict(saved)[1:] == ('fan', 'mmvisatt')
    # the mm-style file, and the same without prefixes, give the official numbers
    mm_model = parity_model(meta, saved).double()
    bare = {k[len('backbone.'):] if k.startswith('backbone.') else k: v for k, v in saved.items()}
    assert convert_state_dict(bare)[1:] == ('fan', 'mmvisatt')
    with torch.no_grad():
        assert _rel(mm_model(images)['logits'], ref['logits']) < 1e-6
    kwargs = dict(classifier=True) if case == 'fan_vit_a' else {}
    model = _pretrained(tmp_path / 'mm.pth', FIXTURE[case], **kwargs)
    assert torch.equal(model.state_dict()['pos_embed.proj.bias' if case == 'fan_vit_a' else 'norm3.bias'],
                       official['pos_embed.token_projection.bias' if case == 'fan_vit_a' else 'norm.bias'])


def test_wrong_files_raise(tmp_path):
    swin = torch.load(DATA.parent / 'revit/reswin_a/state_dict.pth', map_location='cpu', weights_only=True)
    torch.save(swin, tmp_path / 'swin.pth')
    with pytest.raises(CheckpointMismatchError, match='not recognised as fan'):
        _pretrained(tmp_path / 'swin.pth', FIXTURE['fan_swin_a'])
    official = _official('fan_vit_a')
    torch.save({k: v for k, v in official.items() if not k.startswith('blocks.2.')}, tmp_path / 'short.pth')
    with pytest.raises(CheckpointMismatchError, match=r'missing from the checkpoint: blocks\.2\.'):
        _pretrained(tmp_path / 'short.pth', FIXTURE['fan_vit_a'])
    torch.save(official, tmp_path / 'narrow.pth')
    with pytest.raises(CheckpointMismatchError, match='another shape'):
        _pretrained(tmp_path / 'narrow.pth', dict(FIXTURE['fan_vit_a'], embed_dims=64))


def test_configs_name_each_form_by_its_class_and_type_fan_still_builds_with_a_warning():
    from mmengine.config import Config
    from mmengine.registry import MODELS
    from mmvisatt.models.backbones import FANHybrid, FANSwin, FANViT
    forms = {'vit': FANViT, 'hybrid': FANHybrid, 'swin': FANSwin}
    presets = sorted((Path(__file__).parents[1] / 'configs' / '_base_' / 'backbones').glob('fan_*.py'))
    assert len(presets) == 12
    for path in presets:
        backbone = Config.fromfile(str(path)).preset.backbone
        assert backbone.type == forms[path.stem.split('_')[1]].__name__, path.name
    for form, cls in forms.items():
        with pytest.warns(DeprecationWarning, match=f"type='FAN' is deprecated: write type='{cls.__name__}'"):
            model = MODELS.build(dict(type='FAN', arch=TINY[form], drop_path_rate=0.))
        assert type(model) is cls
        # an argument of another form at its default is dropped, as configs written for FAN relied on
        with pytest.warns(DeprecationWarning):
            assert type(FAN(arch=TINY[form], classifier=False, window_size=7)) is cls
