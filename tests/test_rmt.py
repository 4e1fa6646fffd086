"""RMT: preset sizes, Manhattan decay masks, fused == explicit attention, half precision, shapes, training
switches, checkpoint layouts through init_cfg, input errors and the decay-mask tool."""
import importlib
import json
import math
from pathlib import Path

import pytest
import torch

import mmvisatt.models  # noqa: F401  (registers EVT too)
from mmvisatt.analysis.decay import decay_masks, decay_masks_main, effective_receptive_field, plot_decay_masks
from mmvisatt.checkpoint import CheckpointMismatchError, convert_state_dict
from mmvisatt.models.backbones.base import select_release_weights
from mmvisatt.models.backbones.rmt import RMT, ManhattanSelfAttention, RasterRotary
from mmvisatt.models.layers.attention import attention
from mmvisatt.models.layers.spatial_decay import BIAS_FLOOR, SpatialDecay, decay_bias, head_decay_rates

DATA = Path(__file__).parent / 'data' / 'parity' / 'rmt'
TINY = dict(embed_dims=(16, 32, 32, 64), depths=(1, 2, 1, 1), num_heads=(2, 2, 4, 4),
            decomposed=(True, True, False, False), layer_scales=(False, False, True, True))


def _set_fused(model, fused: bool) -> None:
    for m in model.modules():
        if hasattr(m, 'fused'):
            m.fused = fused


def _perturbed(model):
    """Weights with no component close to identity (layer scale at 1e-6 would hide the attention)."""
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(torch.randn_like(p) * (0.1 if p.dim() == 1 or 'gamma' in name else 0.05))
    return model


@pytest.mark.parametrize('arch,index', [('t', 0), ('rmt_s', 1), ('b', 2), ('RMT-L', 3)])
def test_preset_sizes_equal_official(arch, index):
    """Backbone + the official classifier (proj -> 1024, BN, fc) = the official VisRetNet count; the dense output
    norms are ours, and the official state dict has the same number of backbone keys."""
    official = json.loads((DATA / 'param_counts.json').read_text())['variants'][index]
    model = RMT(arch=arch)
    own = sum(p.numel() for k, p in model.named_parameters() if not k.startswith('norm'))
    c4 = model.num_features[-1]
    head = c4 * 1024 + 1024 + 2 * 1024 + 1024 * 1000 + 1000
    assert own + head == official['num_params']
    assert model.num_features == official['official_kwargs']['embed_dims']
    keys = [k for k in model.state_dict() if not k.startswith('norm')]
    assert len(keys) + 9 == official['state_dict_keys']  # head: proj 2, BatchNorm 5, fc 2


def test_presets_follow_the_release():
    t, s = RMT._resolve_arch('t'), RMT._resolve_arch('s')
    assert t['decomposed'] == (True, True, False, False) and s['decomposed'] == (True, True, True, False)
    b = RMT(arch='b')
    assert b.stages[2].blocks[0].gamma_1 is not None and b.stages[1].blocks[0].gamma_1 is None
    assert [RMT._resolve_arch(a)['drop_path_rate'] for a in 'tsbl'] == [0.1, 0.15, 0.4, 0.5]
    with pytest.raises(ValueError, match='Unknown RMT arch'):
        RMT(arch='xl')


def test_decay_rates_and_manhattan_masks():
    assert torch.allclose(head_decay_rates(4, 2, 4).exp(), torch.tensor([.75, .875, .9375, .96875]))
    decay = SpatialDecay(3, 2, 6).double()
    H, W = 3, 4
    full = decay.grid(H, W, 'manhattan', torch.float64)
    line = decay.line(W, torch.float64)
    lg = decay.log_gamma
    for h in range(3):
        for n in range(H * W):
            for m in range(H * W):
                d = abs(n // W - m // W) + abs(n % W - m % W)
                assert math.isclose(full[h, n, m].item(), d * lg[h].item(), rel_tol=1e-12, abs_tol=1e-15)
        for i in range(W):
            for j in range(W):
                assert math.isclose(line[h, i, j].item(), abs(i - j) * lg[h].item(), abs_tol=1e-15)


def test_bias_floor_keeps_half_precision_finite():
    far = torch.tensor([[0., 1e6], [1e6, 0.]])
    for dtype in (torch.float16, torch.bfloat16):
        bias = decay_bias(head_decay_rates(2, 2, 4), far, dtype)
        assert torch.isfinite(bias).all() and bias.min().item() >= BIAS_FLOOR * 1.01


def test_decayed_attention_fused_equals_explicit():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 5, 3, 7, 4, dtype=torch.float64) for _ in range(3))  # (B, H, heads, W, d)
    bias = SpatialDecay(3, 2, 4).double().line(7, torch.float64)
    assert torch.allclose(attention(q, k, v, bias, 1., fused=True), attention(q, k, v, bias, 1., fused=False),
                          rtol=0, atol=1e-12)


def test_model_fused_equals_explicit_float64():
    model = _perturbed(RMT(arch=TINY).double().eval())
    x = torch.randn(1, 3, 70, 45, dtype=torch.float64)
    with torch.no_grad():
        fused = model(x)
        _set_fused(model, False)
        explicit = model(x)
    for a, b in zip(fused, explicit):
        assert torch.allclose(a, b, rtol=0, atol=1e-10)


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_half_precision_at_1333x800(dtype):
    """Stage 1 of a 1333x800 image (334x200 tokens, decomposed as in every preset) with few channels, and the
    full Manhattan bias of stage 3 (84x50 tokens, RMT-T's full-attention stage): no NaN / Inf."""
    torch.manual_seed(0)
    attn = ManhattanSelfAttention(8, 2, decomposed=True).to(dtype)
    rotary, decay = RasterRotary(4).to(dtype), SpatialDecay(2, 2, 4).to(dtype)
    H, W = 334, 200
    sin, cos = rotary(H, W, dtype)
    with torch.no_grad():
        out = attn(torch.randn(1, H, W, 8, dtype=dtype), sin, cos, (decay.line(H, dtype), decay.line(W, dtype)))
    assert torch.isfinite(sin).all() and torch.isfinite(out).all()
    bias = decay.grid(84, 50, 'manhattan', dtype)
    q = torch.randn(1, 2, 84 * 50, 4, dtype=dtype)
    assert torch.isfinite(bias).all() and torch.isfinite(attention(q, q, q, bias, 1.)).all()


def test_frozen_stages_and_norm_eval():
    model = RMT(arch=TINY, frozen_stages=2, norm_eval=True)
    model.train()
    assert not any(p.requires_grad for p in model.patch_embed.parameters())
    assert not any(p.requires_grad for p in model.stages[1].parameters())
    assert all(p.requires_grad for p in model.stages[2].parameters())
    assert not model.patch_embed.proj[1].training and not model.stages[2].downsample.norm.training


def test_bad_inputs():
    model = RMT(arch=TINY)
    with pytest.raises(ValueError, match=r'\(B, 3, H, W\)'):
        model(torch.randn(1, 4, 64, 64))
    with pytest.raises(ValueError, match='at least 32x32'):
        model(torch.randn(1, 3, 64, 16))
    with pytest.raises(ValueError, match='out_indices'):
        RMT(arch=TINY, out_indices=(4, ))


# --- checkpoints ---------------------------------------------------------------------------------------------
def _fixture():
    meta = json.loads((DATA / 'rmt_a' / 'meta.json').read_text())
    kw = meta['official_kwargs']
    arch = dict(embed_dims=kw['embed_dims'], depths=kw['depths'], num_heads=kw['num_heads'],
                mlp_ratios=kw['mlp_ratios'], init_values=kw['init_values'], heads_ranges=kw['heads_ranges'],
                decomposed=kw['chunkwise_recurrents'], layer_scales=kw['layerscales'])
    return arch, torch.load(DATA / 'rmt_a' / 'state_dict.pth', map_location='cpu', weights_only=True)


def _loaded(arch, path, **init):
    model = RMT(arch=arch, init_cfg=dict(type='Pretrained', checkpoint=str(path), **init))
    model.init_weights()
    return model


def _official_value(model, official):
    """The official q_proj weight of block 0 and the (reshaped) layer scale of stage 2, as loaded."""
    return (torch.equal(model.stages[0].blocks[0].attn.q_proj.weight,
                        official['layers.0.blocks.0.retention.q_proj.weight']) and
            torch.equal(model.stages[2].blocks[0].gamma_1, official['layers.2.blocks.0.gamma_1'].reshape(-1)))


@pytest.mark.parametrize('wrap', ['raw', 'model', 'state_dict_module', 'model_ema_aux_head'])
def test_official_release_loads_through_init_cfg(tmp_path, wrap):
    arch, official = _fixture()
    if wrap == 'raw':
        ckpt = official
    elif wrap == 'model':
        ckpt = {'model': official, 'epoch': 3}
    elif wrap == 'state_dict_module':
        ckpt = {'state_dict': {'module.' + k: v for k, v in official.items()}}
    else:  # token-labelling release: an extra aux_head, EMA weights next to the plain ones
        ema = {**official, 'aux_head.weight': torch.randn(10, 128), 'aux_head.bias': torch.randn(10)}
        ckpt = {'model': {k: torch.zeros_like(v) for k, v in official.items()}, 'model_ema': ema}
    torch.save(ckpt, tmp_path / 'rmt.pth')
    assert _official_value(_loaded(arch, tmp_path / 'rmt.pth'), official)


def test_checkpoint_key_selects_the_plain_weights(tmp_path):
    arch, official = _fixture()
    torch.save({'model': official, 'model_ema': {k: v + 1 for k, v in official.items()}}, tmp_path / 'rmt.pth')
    assert _official_value(_loaded(arch, tmp_path / 'rmt.pth', checkpoint_key='model'), official)
    assert not _official_value(_loaded(arch, tmp_path / 'rmt.pth'), official)


def test_release_entry_per_preset():
    """S/B/L report EMA weights, T the plain ones (issue #25); a file with only one entry still loads."""
    plain, ema = {'w': torch.zeros(1)}, {'w': torch.ones(1)}
    assert RMT(arch=TINY)._release_keys == ('model_ema', )
    assert select_release_weights({'model': plain, 'model_ema': ema}, RMT(arch='t')._release_keys) is plain
    assert select_release_weights({'model_ema': ema}, RMT(arch='t')._release_keys) is ema
    assert select_release_weights({'state_dict': plain}, ('model_ema', )) == {'state_dict': plain}


def test_token_label_layout_drops_aux_head_and_maps_the_head():
    _, official = _fixture()
    converted, family, layout = convert_state_dict({**official, 'aux_head.weight': torch.zeros(10, 128)}, 'rmt')
    assert layout == 'official-rmt-token-label' and not any('aux_head' in k for k in converted)
    assert {k for k in converted if not k.startswith('backbone.')} == {
        'neck.proj.weight', 'neck.proj.bias', 'head.fc.weight', 'head.fc.bias', 'neck.norm.weight',
        'neck.norm.bias', 'neck.norm.running_mean', 'neck.norm.running_var', 'neck.norm.num_batches_tracked'}


def test_official_classifier_as_mmpretrain_image_classifier():
    """RMT(out_norms=False) + RMTProjectionNeck + LinearClsHead, loaded from the converted official file, gives
    the official logits (fixture rmt_a)."""
    registry = importlib.import_module('mmpretrain.registry')
    from mmengine.registry import DefaultScope
    arch, official = _fixture()
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        model = registry.MODELS.build(dict(
            type='ImageClassifier', backbone=dict(type='RMT', arch=arch, out_indices=(3, ), out_norms=False),
            neck=dict(type='RMTProjectionNeck', in_channels=128, projection=1024),
            head=dict(type='LinearClsHead', num_classes=10, in_channels=1024)))
    converted, _, _ = convert_state_dict(official, 'rmt')
    assert not set(model.state_dict()) ^ set(converted)
    model.load_state_dict(converted)
    model.double().eval()
    images = torch.load(DATA / 'rmt_a' / 'input.pt', weights_only=True).double()
    ref = torch.load(DATA / 'rmt_a' / 'outputs.pt', weights_only=True)['logits']
    with torch.no_grad():
        logits = model(images, mode='tensor')
    assert ((logits - ref).abs().max() / ref.abs().max()).item() < 1e-6


def test_dense_and_mm_layouts_load(tmp_path):
    arch, official = _fixture()
    norms = {f'extra_norms.{i}.{p}': torch.randn(c) for i, c in enumerate(arch['embed_dims'])
             for p in ('weight', 'bias')}
    dense = {'backbone.' + k: v for k, v in {**official, **norms}.items() if not k.startswith(('proj', 'norm', 'head'))}
    torch.save({'meta': {}, 'state_dict': {**dense, 'neck.lateral.weight': torch.zeros(1)}}, tmp_path / 'det.pth')
    model = _loaded(arch, tmp_path / 'det.pth')
    assert _official_value(model, official) and torch.equal(model.norm3.weight, norms['extra_norms.3.weight'])
    torch.save({'state_dict': {'backbone.' + k: v for k, v in model.state_dict().items()}}, tmp_path / 'mm.pth')
    again = _loaded(arch, tmp_path / 'mm.pth')
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))


def test_checkpoint_of_another_size_raises(tmp_path):
    _, official = _fixture()
    torch.save(official, tmp_path / 'rmt.pth')
    with pytest.raises(CheckpointMismatchError):
        _loaded(TINY, tmp_path / 'rmt.pth')


# --- analysis ------------------------------------------------------------------------------------------------
def test_decay_masks_are_manhattan_powers_of_gamma():
    model = RMT(arch=TINY).eval()
    for stage in (0, 2):  # decomposed and full
        masks = decay_masks(model, stage, (5, 6), (1, 4))
        gammas = torch.tensor(masks.gammas)
        ys, xs = torch.meshgrid(torch.arange(5), torch.arange(6), indexing='ij')
        expected = gammas[:, None, None] ** ((ys - 1).abs() + (xs - 4).abs())
        assert torch.allclose(masks.maps, expected.float(), atol=1e-6)


def test_receptive_field_and_tool_write_pngs(tmp_path):
    model = RMT(arch=TINY).eval()
    erf, query = effective_receptive_field(model, 1, torch.randn(1, 3, 64, 64))
    assert erf.shape == (64, 64) and erf[32, 32] > 0 and query == (4, 4)
    path = plot_decay_masks(decay_masks(model, 0, (16, 16)), str(tmp_path / 'masks.png'))
    assert Path(path).read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    decay_masks_main(['RMT:t', '--size', '64', '--stage', '2', '--out-dir', str(tmp_path / 'tool')])
    for name in ('decay_masks_stage2.png', 'erf_stage2.png'):
        assert (tmp_path / 'tool' / name).read_bytes()[:4] == b'\x89PNG'
    assert json.loads((tmp_path / 'tool' / 'decay_masks.json').read_text())['kind'] == 'full'


@pytest.mark.parametrize('cls_name', ['RMT', 'EVT'])
def test_norm_cfg_sets_the_stem_and_downsampling_norms(cls_name):
    """``norm_cfg=SyncBN`` (the official dense code's norm, which the dense configs set) replaces every BatchNorm of
    the stem and the downsampling convs, with the same state-dict keys (so release files load either way), and
    the norms train: one step advances their statistics once."""
    from mmengine.registry import MODELS
    cls = MODELS.get(cls_name)
    torch.manual_seed(0)
    plain, synced = cls(arch=TINY), cls(arch=TINY, norm_cfg=dict(type='SyncBN'))
    batch_norms = [m for m in plain.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    synced_norms = [m for m in synced.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    assert len(batch_norms) == len(synced_norms) == 4 + 3  # four stem convs, three downsamplings
    assert all(type(m) is torch.nn.BatchNorm2d for m in batch_norms)
    assert all(isinstance(m, torch.nn.SyncBatchNorm) for m in synced_norms)
    assert plain.state_dict().keys() == synced.state_dict().keys()
    synced.load_state_dict(plain.state_dict())
    synced.train()
    sum(o.mean() for o in synced(torch.randn(2, 3, 64, 64))).backward()  # one process: SyncBN acts as BN
    assert all(m.num_batches_tracked.item() == 1 for m in synced_norms)
    plain.eval(), synced.eval()
    x = torch.randn(1, 3, 64, 64)
    synced.load_state_dict(plain.state_dict())
    with torch.no_grad():
        assert all(torch.equal(a, b) for a, b in zip(plain(x), synced(x)))
