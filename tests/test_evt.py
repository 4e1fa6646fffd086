"""EVT (no official code or fixture exists): structure, Euclidean decay, EuSAg / EuSAd grouping with padding,
equivalence of grouped attention with a masked full-attention reference, precision, shapes and loading."""
import importlib
import math
from pathlib import Path

import pytest
import torch

from mmvisatt.analysis.decay import decay_masks, plot_decay_masks
from mmvisatt.checkpoint import CheckpointMismatchError
from mmvisatt.models.backbones.evt import EVT, EuclideanSelfAttention, SwinEuSABlock
from mmvisatt.models.backbones.rmt import RMT
from mmvisatt.models.layers.spatial_decay import SpatialDecay, group_tokens, token_groups, ungroup_tokens

TINY = dict(embed_dims=(16, 32, 32, 64), depths=(2, 2, 1, 1), num_heads=(2, 2, 4, 4))


def _set_fused(model, fused: bool) -> None:
    for m in model.modules():
        if hasattr(m, 'fused'):
            m.fused = fused


def _count(model, skip=()) -> int:
    return sum(p.numel() for k, p in model.named_parameters() if not k.startswith(skip))


def test_block_is_cpe_eusa_classic_ffn():
    """Section 3.2: CPE + EuSA + the classic FFN; nothing of RMT's block that the text does not name (no LCE in
    the attention, no depthwise conv in the FFN, no rotary phase, no layer scale)."""
    model = EVT(arch='t')
    block = model.stages[0].blocks[0]
    assert isinstance(block.cpe, torch.nn.Conv2d) and block.cpe.groups == block.cpe.in_channels == 64
    assert isinstance(block.attn, EuclideanSelfAttention)
    weighted = [n for n, m in block.ffn.named_modules() if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d))]
    assert weighted == ['fc1', 'fc2'] and isinstance(block.ffn.act, torch.nn.GELU)
    names = [k for k, _ in model.named_parameters()]
    assert not any('lce' in k or 'dwconv' in k or 'gamma_' in k or 'rotary' in k for k in names)
    assert not any(k.endswith('.angle') for k, _ in model.named_buffers())


@pytest.mark.parametrize('arch', ['t', 'evt_s', 'b', 'l'])
def test_presets_follow_rmt_with_eusa(arch):
    """EVT-T/S/B/L: RMT's widths and heads of the same size; EuSAg / EuSAd in stages 1-3, full EuSA in stage 4."""
    evt, rmt = EVT(arch=arch), RMT(arch=arch.replace('evt_', ''))
    assert evt.num_features == rmt.num_features
    assert [s.decay.log_gamma.numel() for s in evt.stages] == [s.decay.log_gamma.numel() for s in rmt.stages]
    modes = [s.modes for s in evt.stages]
    assert all(set(m) == {'grouped', 'dilated'} for m in modes[:3])
    assert set(modes[3]) == {'full'}


def test_evt_t_is_deeper_than_rmt_t():
    evt, rmt = EVT(arch='t'), RMT(arch='t')
    assert sum(len(s.blocks) for s in evt.stages) > sum(len(s.blocks) for s in rmt.stages)


@pytest.mark.parametrize('size', ['t', 's', 'b'])
def test_swin_forms_are_swin_with_eusa(size):
    """evt_swin_<size> = timm's Swin-<size> without its relative-position tables and classifier, plus our four
    output norms in place of Swin's final norm; (S)W-MSA -> EuSAg / EuSAd, the last stage full EuSA."""
    timm = importlib.import_module('timm')
    width = {'t': 'tiny', 's': 'small', 'b': 'base'}[size]
    model = EVT(arch=f'evt_swin_{size}')
    swin = timm.create_model(f'swin_{width}_patch4_window7_224', pretrained=False)
    swin_count = _count(swin, ('head', 'norm.')) - sum(
        p.numel() for k, p in swin.named_parameters() if 'relative_position_bias_table' in k)
    assert _count(model, ('norm', )) == swin_count
    assert model.num_features == [swin.feature_info[i]['num_chs'] for i in range(4)]
    assert isinstance(model.stages[0].blocks[0], SwinEuSABlock) and not hasattr(model.stages[0].blocks[0], 'cpe')
    assert [b.attn.mode for b in model.stages[2].blocks] == ['grouped', 'dilated'] * (len(model.stages[2].blocks) // 2)
    assert set(model.stages[3].modes) == {'full'}


def test_euclidean_masks():
    decay = SpatialDecay(3, 2, 6).double()
    H, W = 3, 4
    full = decay.grid(H, W, 'euclidean', torch.float64)
    for h in range(3):
        for n in range(H * W):
            for m in range(H * W):
                d = math.hypot(n // W - m // W, n % W - m % W)
                assert math.isclose(full[h, n, m].item(), d * decay.log_gamma[h].item(), rel_tol=1e-12,
                                    abs_tol=1e-15)


@pytest.mark.parametrize('mode', ['grouped', 'dilated'])
@pytest.mark.parametrize('hw,size', [((7, 7), 49), ((5, 9), 7), ((6, 5), 49), ((4, 13), 10), ((1, 3), 2)])
def test_groups_partition_tokens_once(mode, hw, size):
    H, W = hw
    n = H * W
    g = token_groups(H, W, size, mode, torch.device('cpu'), torch.float64)
    G, gs = g.valid.shape
    assert gs == min(size, n) and G == -(-n // gs) and g.padding == G * gs - n
    assert torch.equal(g.order.sort().values, torch.arange(G * gs))
    real = g.order.view(G, gs)[g.valid]
    assert torch.equal(real.sort().values, torch.arange(n)) and int(g.valid.sum()) == n
    assert g.valid.any(dim=1).all()  # no group of padding only: no row without a key
    groups = g.order.view(G, gs)
    if mode == 'grouped':
        assert torch.equal(groups, torch.arange(G * gs).view(G, gs))
    else:
        assert all((groups[j] % G == j).all() for j in range(G))
    x = torch.randn(2, n, 3)
    grouped = group_tokens(x, g)
    assert grouped.shape == (2, G, gs, 3)
    # the reshape puts every token where the grouping's order says
    assert torch.equal(grouped, torch.cat([x, x.new_zeros(2, g.padding, 3)], 1)[:, g.order].view(2, G, gs, 3))
    assert torch.equal(ungroup_tokens(grouped, g), x)
    pos = torch.stack([groups.clamp_max(n - 1) // W, groups.clamp_max(n - 1) % W], -1).double()
    for j in range(G):
        for a in range(gs):
            for b in range(gs):
                if g.valid[j, a] and g.valid[j, b]:
                    assert math.isclose(g.distance[j, a, b].item(), (pos[j, a] - pos[j, b]).norm().item(),
                                        abs_tol=1e-12)


@pytest.mark.parametrize('mode', ['grouped', 'dilated'])
def test_grouped_attention_equals_masked_full_attention(mode):
    """EuSAg / EuSAd = full attention with the Euclidean decay where query and key share a group and no
    attention elsewhere; padding (5x9 tokens in groups of 7) changes nothing."""
    torch.manual_seed(0)
    H, W, size = 5, 9, 7
    attn = EuclideanSelfAttention(8, 2, mode, fused=False).double()
    decay = SpatialDecay(2, 2, 4).double()
    groups, bias = decay.groups(H, W, size, mode, torch.float64)
    x = torch.randn(2, H, W, 8, dtype=torch.float64)
    with torch.no_grad():
        ours = attn(x, bias, groups)
        label = torch.empty(H * W, dtype=torch.long)
        label[groups.order[groups.order < H * W]] = torch.arange(groups.order.numel())[groups.order < H * W] // 7
        same = label[:, None] == label[None, :]
        full_bias = decay.grid(H, W, 'euclidean', torch.float64).masked_fill(~same, float('-inf'))
        attn.mode = 'full'
        reference = attn(x, full_bias)
    assert torch.allclose(ours, reference, rtol=0, atol=1e-12)


def test_group_covering_the_map_is_full_attention():
    torch.manual_seed(0)
    model = EVT(arch=dict(TINY, full_attention=(False, False, False, False)), group_size=10 ** 4).double().eval()
    full = EVT(arch=dict(TINY, full_attention=(True, True, True, True))).double().eval()
    full.load_state_dict(model.state_dict())
    x = torch.randn(1, 3, 40, 56, dtype=torch.float64)
    with torch.no_grad():
        for a, b in zip(model(x), full(x)):
            assert torch.allclose(a, b, rtol=0, atol=1e-10)


def test_group_size_and_per_head_decay_matter():
    torch.manual_seed(0)
    a = EVT(arch=TINY, group_size=49).eval()
    b = EVT(arch=TINY, group_size=16).eval()
    b.load_state_dict(a.state_dict())
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        assert not torch.allclose(a(x)[0], b(x)[0], atol=1e-4)
    gammas = a.stages[2].decay.log_gamma.exp()
    assert len(set(gammas.tolist())) == 4 and gammas[0].item() == 0.75


def test_fused_equals_explicit_float64():
    torch.manual_seed(0)
    model = EVT(arch=TINY, group_size=10).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    x = torch.randn(1, 3, 75, 53, dtype=torch.float64)
    with torch.no_grad():
        fused = model(x)
        _set_fused(model, False)
        explicit = model(x)
    for a, b in zip(fused, explicit):
        assert torch.allclose(a, b, rtol=0, atol=1e-10)


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_half_precision_at_1333x800(dtype):
    """EuSAg / EuSAd on stage 1 of a 1333x800 image (334x200 tokens, padded groups of 49) and full attention on
    its last stage (42x25), few channels: no NaN / Inf."""
    torch.manual_seed(0)
    decay = SpatialDecay(2, 2, 4).to(dtype)
    x = torch.randn(1, 334, 200, 8, dtype=dtype)
    with torch.no_grad():
        for mode in ('grouped', 'dilated'):
            groups, bias = decay.groups(334, 200, 49, mode, dtype)
            assert groups.padding > 0 and torch.isfinite(bias).all()
            assert torch.isfinite(EuclideanSelfAttention(8, 2, mode).to(dtype)(x, bias, groups)).all()
        bias = decay.grid(42, 25, 'euclidean', dtype)
        out = EuclideanSelfAttention(8, 2, 'full').to(dtype)(torch.randn(1, 42, 25, 8, dtype=dtype), bias)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize('arch', [TINY, dict(TINY, style='swin')])
@pytest.mark.parametrize('out_indices', [(0, 1, 2, 3), (0, ), (1, ), (2, ), (3, ), (1, 3)])
def test_odd_input_sizes(arch, out_indices):
    model = EVT(arch=arch, out_indices=out_indices, group_size=12).eval()
    with torch.no_grad():
        outs = model(torch.randn(1, 3, 77, 61))
    h, w, sizes = 77, 61, []
    for _ in range(5):
        h, w = -(-h // 2), -(-w // 2)
        sizes.append((h, w))
    assert len(outs) == len(out_indices)
    for out, i in zip(outs, out_indices):
        assert tuple(out.shape) == (1, TINY['embed_dims'][i], *sizes[i + 1])
        assert torch.isfinite(out).all()


def test_bad_inputs():
    model = EVT(arch=TINY)
    with pytest.raises(ValueError, match=r'\(B, 3, H, W\)'):
        model(torch.randn(1, 1, 64, 64))
    with pytest.raises(ValueError, match='at least 32x32'):
        model(torch.randn(1, 3, 31, 64))
    with pytest.raises(ValueError, match='group_size'):
        EVT(arch=TINY, group_size=0)
    with pytest.raises(ValueError, match='style'):
        EVT(arch=dict(TINY, style='convnext'))


def test_mm_checkpoint_loads_and_rmt_files_are_refused(tmp_path):
    model = EVT(arch=TINY)
    model.init_weights()
    torch.save({'state_dict': {'backbone.' + k: v for k, v in model.state_dict().items()}}, tmp_path / 'evt.pth')
    loaded = EVT(arch=TINY, init_cfg=dict(type='Pretrained', checkpoint=str(tmp_path / 'evt.pth')))
    loaded.init_weights()
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values()))
    rmt = RMT(arch=dict(TINY, decomposed=(True, True, True, False)))
    torch.save({'state_dict': {'backbone.' + k: v for k, v in rmt.state_dict().items()}}, tmp_path / 'rmt.pth')
    with pytest.raises(CheckpointMismatchError, match='not recognised'):
        EVT(arch=TINY, init_cfg=dict(type='Pretrained', checkpoint=str(tmp_path / 'rmt.pth'))).init_weights()


def test_decay_masks_are_euclidean_inside_the_group(tmp_path):
    model = EVT(arch=TINY, group_size=10).eval()
    H, W, q = 6, 7, (2, 3)
    ys, xs = torch.meshgrid(torch.arange(H), torch.arange(W), indexing='ij')
    dist = ((ys - q[0]) ** 2 + (xs - q[1]) ** 2).double().sqrt()
    for block, mode in ((0, 'grouped'), (1, 'dilated')):
        masks = decay_masks(model, 0, (H, W), q, block)
        assert masks.kind == mode
        g = token_groups(H, W, 10, mode, torch.device('cpu'), torch.float32)
        members = g.order.view(g.valid.shape)[g.inverse[q[0] * W + q[1]] // 10]
        inside = torch.zeros(H * W, dtype=torch.bool)
        inside[members[members < H * W]] = True
        expected = (torch.tensor(masks.gammas, dtype=torch.float64)[:, None, None] ** dist) * inside.view(H, W)
        assert torch.allclose(masks.maps.double(), expected, atol=1e-6)
    path = plot_decay_masks(decay_masks(model, 3, (3, 4)), str(tmp_path / 'evt.png'))
    assert Path(path).read_bytes()[:4] == b'\x89PNG'


@pytest.mark.parametrize('mode', ['grouped', 'dilated'])
@pytest.mark.parametrize('hw,size', [((7, 7), 49), ((5, 9), 7), ((2, 3), 5), ((4, 13), 10), ((10, 13), 49)])
def test_fused_grouped_attention_equals_the_reference(mode, hw, size):
    """The fused kernel on the gathered groups, padded keys masked by the bias floor, gives the explicit softmax's
    result for every real token, batch 2."""
    from mmvisatt.models.layers.attention import attention
    H, W = hw
    n, heads = H * W, 3
    decay = SpatialDecay(heads).double()
    groups, bias = decay.groups(H, W, size, mode, torch.float64)
    q, k, v = (torch.randn(2, n, heads * 4, dtype=torch.float64) for _ in range(3))
    qg, kg, vg = (group_tokens(t, groups).unflatten(-1, (heads, -1)).permute(0, 3, 1, 2, 4).flatten(1, 2)
                  for t in (q, k, v))
    out = {fused: ungroup_tokens(attention(qg, kg, vg, bias.flatten(0, 1), 1., fused=fused)
                                 .unflatten(1, (heads, -1)).permute(0, 2, 3, 1, 4).flatten(-2), groups)
           for fused in (True, False)}
    assert out[True].shape == (2, n, heads * 4)
    torch.testing.assert_close(out[True], out[False], rtol=1e-9, atol=1e-10)
