"""ReMViTv2: equivalence with timm / mmpretrain MViTv2 at alpha = 1, the two residual alignments, input sizes,
checkpoints and the registry."""
import importlib
import itertools
import json
import re
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from mmvisatt.checkpoint import (CheckpointMismatchError, convert_checkpoint_file, convert_state_dict, load_into,
                                 load_pretrained)
from mmvisatt.models.backbones import ReMViTv2
from mmvisatt.models.layers.residual_attention import PooledScores, TokenGrid, align_pooled_by_position
from mmvisatt.testing import parity_model
from mmvisatt.testing.parity.revit import align_pooled_official, use_official_alignment

DATA = Path(__file__).parent / 'data/parity/revit'
OFFICIAL = DATA / 'remvit_a/state_dict.pth'
TINY = dict(embed_dims=16, depths=(1, 1, 2, 1), num_heads=1)
# the remvit_a case: q-stride 2 and width/heads x2 at blocks 1, 2, 3 of 5
FIXTURE_ARCH = dict(embed_dims=16, depths=(1, 1, 1, 2), num_heads=1)


@pytest.fixture(scope='module')
def official():
    return torch.load(OFFICIAL, map_location='cpu', weights_only=True)


def _perturb(module: nn.Module) -> nn.Module:
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn_like(p) * (0.02 if p.dim() > 1 else 0.1))
    return module


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


def _stage_outputs(model: ReMViTv2, x: torch.Tensor):
    """Raw (pre-norm) outputs of the last block of each stage, NHWC."""
    captured = []
    handles = [s.register_forward_hook(lambda m, a, out: captured.append(out[0])) for s in model.stages]
    with torch.no_grad():
        model(x)
    for h in handles:
        h.remove()
    return captured


def test_alpha_one_equals_timm_mvitv2_tiny():
    timm = importlib.import_module('timm')
    torch.manual_seed(0)
    reference = _perturb(timm.create_model('mvitv2_tiny', pretrained=False).double().eval())
    converted, family, layout = convert_state_dict(reference.state_dict())
    assert (family, layout) == ('remvit', 'timm-mvitv2')
    model = ReMViTv2(arch='t').double().eval()
    load_into(model, {k[9:]: v for k, v in converted.items() if k.startswith('backbone.')}, source='timm',
              layout=layout, allow_missing=ReMViTv2.not_in_pretrained)
    with torch.no_grad():
        model.alpha.fill_(1.0)
    x = torch.randn(1, 3, 224, 224, dtype=torch.float64)
    theirs = []
    for stage in reference.stages:
        stage.register_forward_hook(lambda m, a, out: theirs.append(out[0]))
    with torch.no_grad():
        reference(x)
    ours = _stage_outputs(model, x)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert _rel(a.flatten(1, 2), b) < 1e-6, f'stage {i}'
    with torch.no_grad():
        model.alpha.fill_(0.5)
    assert _rel(_stage_outputs(model, x)[-1].flatten(1, 2), theirs[-1]) > 1e-3


def test_alpha_one_equals_mmpretrain_mvit_on_non_square_inputs():
    """timm cannot run other sizes; mmpretrain interpolates the relative-position tables like we do."""
    mvit = importlib.import_module('mmpretrain.models.backbones.mvit')
    torch.manual_seed(0)
    # out_scales: only the last, because mmpretrain feeds the *normalised* map on after every output scale
    reference = mvit.MViT(arch=dict(embed_dims=16, num_layers=5, num_heads=1, downscale_indices=[1, 2, 4]),
                          out_scales=[3]).double()
    reference.eval()
    _perturb(reference)
    model = ReMViTv2(arch=TINY, out_indices=(3, )).double().eval()
    names = [f'stages.{i}.blocks.{j}' for i, stage in enumerate(model.stages) for j in range(len(stage.blocks))]
    state = {'alpha': torch.ones(1, dtype=torch.float64)}
    for key, value in reference.state_dict().items():
        key = key.replace('patch_embed.projection.', 'patch_embed.proj.')
        m = re.match(r'blocks\.(\d+)\.(.*)', key)
        if m:
            key = f"{names[int(m.group(1))]}.{re.sub(r'^proj[.]', 'shortcut_proj.', m.group(2))}"
        state[key] = value
    model.load_state_dict(state)
    for shape in [(1, 3, 157, 229), (2, 3, 61, 45)]:
        x = torch.randn(*shape, dtype=torch.float64)
        with torch.no_grad():
            assert _rel(model(x)[0], reference(x)[0]) < 1e-6, shape


def test_aligned_mode_equals_official_where_the_official_code_runs(official):
    """On 224x224 (square maps, sides divisible by the strides) the position alignment and the official one (the
    parity fixtures', on the test side) both reproduce the official outputs."""
    ref = torch.load(DATA / 'remvit_a/outputs.pt', weights_only=True)
    images = torch.load(DATA / 'remvit_a/input.pt', weights_only=True).double()
    for mode in ('aligned', 'official'):
        model = ReMViTv2(arch=FIXTURE_ARCH).double().eval()
        if mode == 'official':
            use_official_alignment(model)
        load_pretrained(model, official, family='remvit', allow_missing=ReMViTv2.not_in_pretrained)
        for i, (a, b) in enumerate(zip(_stage_outputs(model, images), ref['stages'])):
            assert _rel(a.permute(0, 3, 1, 2), b) < 1e-6, f'{mode} stage {i}'


def test_parity_fixture_detects_a_dropped_residual():
    """The remvit_a fixture is sensitive to the residual path: without it parity breaks (the test can fail)."""
    case = DATA / 'remvit_a'
    meta = json.loads((case / 'meta.json').read_text())
    model = parity_model(meta, torch.load(case / 'state_dict.pth', weights_only=True)).double()
    ref = torch.load(case / 'outputs.pt', weights_only=True)
    for module in model.modules():
        if hasattr(module, 'align'):
            module.align = lambda *args: None  # residual_attention then keeps the layer's own scores
    with torch.no_grad():
        out = model(torch.load(case / 'input.pt', weights_only=True).double())
    assert _rel(out['stages'][-1], ref['stages'][-1]) > 1e-2


def _axis_sources(src_len: int, src_stride: int, dst_len: int, dst_stride: int):
    """For each destination index, the source indices of the same positions (a block, or its one parent)."""
    if dst_stride >= src_stride:
        k = dst_stride // src_stride
        return [[s for s in range(i * k, i * k + k) if s < src_len] for i in range(dst_len)]
    k = src_stride // dst_stride
    return [[i // k] for i in range(dst_len)]


def _cells(grid: TokenGrid, prev: TokenGrid):
    rows = _axis_sources(prev.height, prev.stride_h, grid.height, grid.stride_h)
    cols = _axis_sources(prev.width, prev.stride_w, grid.width, grid.stride_w)
    return [[r * prev.width + c for r in rs for c in cs] for rs, cs in itertools.product(rows, cols)]


@pytest.mark.parametrize('heads', [(2, 2), (2, 4)])
def test_aligned_resampling_matches_a_loop_reference(heads):
    """Odd, non-square maps, a coarser query grid, a finer key grid and a mixed (pool one axis, copy the other)
    key grid: every aligned score is the mean of the previous scores of the same positions."""
    torch.manual_seed(0)
    prev_q, q = TokenGrid(7, 10, 1, 1), TokenGrid(4, 5, 2, 2)
    for prev_kv, kv in ((TokenGrid(2, 3, 4, 4), TokenGrid(4, 5, 2, 2)), (TokenGrid(7, 3, 1, 4), TokenGrid(4, 5, 2, 2))):
        scores = torch.randn(2, heads[0], prev_q.num_tokens, prev_kv.num_tokens, dtype=torch.float64)
        aligned = align_pooled_by_position(PooledScores(scores, prev_q, prev_kv), q, kv, heads[1])
        source = scores if heads[0] == heads[1] else scores.mean(1, keepdim=True)
        expected = torch.stack([
            torch.stack([source[:, :, qs][:, :, :, ks].mean(dim=(-1, -2)) for ks in _cells(kv, prev_kv)], -1)
            for qs in _cells(q, prev_q)
        ], -2)
        assert aligned.shape == (2, source.shape[1], q.num_tokens, kv.num_tokens)
        assert torch.allclose(aligned, expected, atol=1e-12)


def test_official_alignment_is_the_square_grid_logic():
    scores = torch.randn(1, 2, 64, 16, dtype=torch.float64)
    prev = PooledScores(scores, TokenGrid(8, 8), TokenGrid(4, 4, 2, 2))
    out = align_pooled_official(prev, TokenGrid(4, 4, 2, 2), TokenGrid(8, 8), num_heads=4)
    grid = scores.mean(1).reshape(8, 8, 4, 4)
    expected = grid.reshape(4, 2, 4, 2, 4, 4).mean(dim=(1, 3))  # queries: 2x2 average
    expected = expected.repeat_interleave(2, -2).repeat_interleave(2, -1)  # keys: nearest x2
    assert torch.allclose(out.reshape(4, 4, 8, 8), expected)
    with pytest.raises(ValueError, match='ReMViTv2 itself aligns by position'):
        align_pooled_official(PooledScores(torch.zeros(1, 1, 6, 4), TokenGrid(2, 3), TokenGrid(2, 2)),
                              TokenGrid(1, 2), TokenGrid(2, 2), 1)


@pytest.mark.parametrize('out_indices', [(0, 1, 2, 3), (0, ), (1, ), (2, ), (3, ), (1, 3)])
def test_any_input_size(out_indices):
    model = ReMViTv2(arch=TINY, out_indices=out_indices).eval()
    with torch.no_grad():
        outs = model(torch.randn(1, 3, 333, 517))
    assert len(outs) == len(out_indices)
    for out, i in zip(outs, out_indices):
        s = 4 * 2 ** i
        assert tuple(out.shape) == (1, 16 * 2 ** i, -(-333 // s), -(-517 // s))
        assert torch.isfinite(out).all()


def test_official_alignment_refuses_what_the_official_code_cannot_run():
    """The parity fixtures' alignment (the official code's, on the test side) runs where the official code runs and
    says so elsewhere; ReMViTv2 itself takes any size."""
    model = use_official_alignment(ReMViTv2(arch=TINY).eval())
    with torch.no_grad():
        assert [o.shape[-1] for o in model(torch.randn(1, 3, 256, 256))] == [64, 32, 16, 8]
        for size in ((333, 517), (232, 232)):  # non-square; square but 58 -> 15 keys cannot grow to 29
            with pytest.raises(ValueError, match='ReMViTv2 itself aligns by position and takes any size'):
                model(torch.randn(1, 3, *size))


def test_relative_position_tables_are_interpolated_like_a_resized_checkpoint(official):
    """A 224-model meeting 288 px inputs resizes its tables to the grids; a 288-model loading the same weights
    resizes them at load time: the same numbers."""
    small = ReMViTv2(arch=FIXTURE_ARCH).double().eval()
    large = ReMViTv2(arch=FIXTURE_ARCH, img_size=288).double().eval()
    for model in (small, large):
        load_pretrained(model, official, family='remvit', allow_missing=ReMViTv2.not_in_pretrained)
    assert large.stages[0].blocks[0].attn.rel_pos_h.shape == (143, 16)
    x = torch.randn(1, 3, 288, 288, dtype=torch.float64)
    with torch.no_grad():
        for a, b in zip(small(x), large(x)):
            assert _rel(a, b) < 1e-6


@pytest.mark.parametrize('arch,timm_name', [('t', 'mvitv2_tiny'), ('s', 'mvitv2_small'), ('b', 'mvitv2_base')])
def test_parameter_counts(arch, timm_name):
    timm = importlib.import_module('timm')
    with torch.device('meta'):
        backbone = ReMViTv2(arch=arch, out_indices=(3, ))
        head = nn.Linear(768, 1000)
        reference = timm.create_model(timm_name, pretrained=False)
    total = sum(p.numel() for p in backbone.parameters()) + sum(p.numel() for p in head.parameters())
    assert total == sum(p.numel() for p in reference.parameters()) + 1  # + alpha
    if arch == 't':
        counts = json.loads((DATA / 'param_counts.json').read_text())['variants']['ReMViTv2-T']
        assert total == counts['num_params'] == 24_173_321
        assert len(backbone.state_dict()) + 2 == counts['state_dict_keys']


def test_arch_presets_and_input_errors():
    for arch, blocks in (('t', 10), ('remvit_s', 16), ('base', 24)):
        with torch.device('meta'):
            model = ReMViTv2(arch=arch)
        assert sum(len(s.blocks) for s in model.stages) == blocks and model.num_features == [96, 192, 384, 768]
    with pytest.raises(ValueError, match=r"Unknown ReMViTv2 arch 'x'.*\['b', 's', 't'\]"):
        ReMViTv2(arch='x')
    with pytest.raises(ValueError, match='one entry per stage'):
        ReMViTv2(arch=dict(TINY, num_heads=(1, 2)))
    with pytest.raises(TypeError, match='residual_mode'):
        ReMViTv2(arch=TINY, residual_mode='official')  # the official alignment is the parity fixtures' alone
    model = ReMViTv2(arch=TINY)
    with pytest.raises(ValueError, match=r'expects images of shape \(B, 3, H, W\).*in_channels=4'):
        model(torch.randn(1, 4, 64, 64))
    with pytest.raises(ValueError, match='at least 4x4 pixels'):
        model(torch.randn(1, 3, 64, 3))


def test_frozen_stages_and_norm_eval():
    model = ReMViTv2(arch=TINY, frozen_stages=2, norm_eval=True)
    model.train()
    assert not any(p.requires_grad for p in model.patch_embed.parameters())
    assert not any(p.requires_grad for p in model.stages[1].parameters())
    assert all(p.requires_grad for p in model.stages[2].parameters())
    assert not model.norm1.weight.requires_grad and model.norm2.weight.requires_grad
    assert not model.alpha.requires_grad
    assert not model.stages[0].training and model.stages[2].blocks[0].training
    assert not model.norm3.training  # norm_eval


# ------------------------------------------------------------------------------------------------ checkpoints
def _pretrained(path, **kwargs) -> ReMViTv2:
    model = ReMViTv2(arch=FIXTURE_ARCH, init_cfg=dict(type='Pretrained', checkpoint=str(path)), **kwargs)
    model.init_weights()
    return model


def _assert_from_official(model: ReMViTv2, official) -> None:
    own = model.state_dict()
    assert torch.equal(own['stages.3.blocks.1.attn.rel_pos_h'], official['blocks.4.attn.rel_pos_h'])
    assert torch.equal(own['stages.2.blocks.0.shortcut_proj.weight'], official['blocks.2.proj.weight'])
    assert torch.equal(own['norm3.weight'], official['norm.weight'])
    assert own['alpha'].item() == pytest.approx(0.3)


@pytest.mark.parametrize('wrap', ['model_state', 'model_state_dict', 'raw'])
def test_official_release_files(tmp_path, official, wrap):
    # MViTv2 .pyth files nest the weights under 'model_state'; the ReViT script saves a DDP model
    ckpt = official if wrap == 'raw' else {wrap: {f'module.{k}': v for k, v in official.items()}, 'epoch': 3}
    torch.save(ckpt, tmp_path / 'remvit.pyth')
    _assert_from_official(_pretrained(tmp_path / 'remvit.pyth'), official)


def test_official_mvitv2_file_without_alpha(official):
    model = ReMViTv2(arch=FIXTURE_ARCH)
    sd = {k: v for k, v in official.items() if k != 'alpha'}
    report = load_pretrained(model, {'model_state': sd}, family='remvit', allow_missing=model.not_in_pretrained)
    assert report.layout == 'official-mvitv2'
    assert sorted(report.missing) == ['alpha', 'norm0.bias', 'norm0.weight', 'norm1.bias', 'norm1.weight',
                                      'norm2.bias', 'norm2.weight']
    assert model.alpha.item() == 0.5


def test_timm_layout(tmp_path):
    mvitv2 = importlib.import_module('timm.models.mvitv2')
    MultiScaleVit, MultiScaleVitCfg = mvitv2.MultiScaleVit, mvitv2.MultiScaleVitCfg
    reference = MultiScaleVit(MultiScaleVitCfg(depths=(1, 1, 2, 1), embed_dim=16, num_heads=1), num_classes=10)
    sd = reference.state_dict()
    torch.save(sd, tmp_path / 'timm.pth')
    model = ReMViTv2(arch=TINY, init_cfg=dict(type='Pretrained', checkpoint=str(tmp_path / 'timm.pth')))
    model.init_weights()
    own = model.state_dict()
    assert torch.equal(own['stages.2.blocks.0.shortcut_proj.bias'], sd['stages.2.blocks.0.shortcut_proj_attn.bias'])
    assert torch.equal(own['norm3.weight'], sd['norm.weight'])


def test_mm_style_roundtrip(tmp_path, official):
    torch.save({'model_state': official}, tmp_path / 'official.pyth')
    family, layout, _ = convert_checkpoint_file(str(tmp_path / 'official.pyth'), str(tmp_path / 'mm.pth'))
    assert (family, layout) == ('remvit', 'official-remvit')
    saved = torch.load(tmp_path / 'mm.pth', map_location='cpu', weights_only=True)['state_dict']
    assert 'head.fc.weight' in saved and convert_state_dict(saved)[1:] == ('remvit', 'mmvisatt')
    _assert_from_official(_pretrained(tmp_path / 'mm.pth'), official)


def test_layouts_are_detected_without_a_family(official):
    """One converter per family and none claims another's files (all of MViTv2, Swin and mm-style ReSwin have
    'stages.0.blocks.0.attn.qkv.weight')."""
    swin = torch.load(DATA / 'reswin_a/state_dict.pth', map_location='cpu', weights_only=True)
    vit = torch.load(DATA / 'revit_a/state_dict.pth', map_location='cpu', weights_only=True)
    cases = {('reswin', 'official-swin'): swin, ('revit', 'official-revit'): vit,
             ('remvit', 'official-remvit'): official}
    for expected, sd in list(cases.items()):
        converted = convert_state_dict(sd)[0]
        cases[(expected[0], 'mmvisatt')] = converted
        cases[(expected[0], 'mmvisatt ')] = {k[9:]: v for k, v in converted.items() if k.startswith('backbone.')}
    for (family, layout), sd in cases.items():
        assert convert_state_dict(sd)[1:] == (family, layout.strip()), (family, layout)


def test_wrong_files_raise(tmp_path, official):
    vit = torch.load(DATA / 'revit_a/state_dict.pth', map_location='cpu', weights_only=True)
    torch.save(vit, tmp_path / 'vit.pth')
    with pytest.raises(CheckpointMismatchError, match='not recognised as remvit'):
        _pretrained(tmp_path / 'vit.pth')
    torch.save({k: v for k, v in official.items() if not k.startswith('blocks.4.')}, tmp_path / 'short.pth')
    with pytest.raises(CheckpointMismatchError, match=r'missing from the checkpoint: stages\.3\.blocks\.1\.'):
        _pretrained(tmp_path / 'short.pth')
    torch.save(official, tmp_path / 'other.pth')
    with pytest.raises(CheckpointMismatchError, match='another shape'):
        ReMViTv2(arch=dict(FIXTURE_ARCH, embed_dims=32),
                 init_cfg=dict(type='Pretrained', checkpoint=str(tmp_path / 'other.pth'))).init_weights()
