"""ShuntedTransformer: presets, odd sizes, head-group order, attention paths, training switches, checkpoints."""
import json
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from mmvisatt.checkpoint import CheckpointMismatchError, convert_checkpoint_file, convert_state_dict
from mmvisatt.models.backbones.shunted import ShuntedAttention, ShuntedTransformer
from mmvisatt.testing.parity.shunted import official_numerics

DATA = Path(__file__).parent / 'data' / 'parity' / 'shunted'
TINY = dict(embed_dims=(16, 32, 32, 64), depths=(1, 1, 1, 1), num_heads=(2, 2, 2, 4), mlp_ratios=(2, 2, 2, 2),
            sr_ratios=(8, 4, 2, 1))


def _tiny(odd_size: str = 'pad', **kwargs) -> ShuntedTransformer:
    """``odd_size='floor'``: the official code's flooring of sizes the strides do not divide (test side)."""
    torch.manual_seed(0)
    model = ShuntedTransformer(arch=TINY, drop_path_rate=0., **kwargs)
    model.init_weights()
    return official_numerics(model) if odd_size == 'floor' else model


def _case(name: str):
    case = DATA / name
    meta = json.loads((case / 'meta.json').read_text())
    state_dict = torch.load(case / 'state_dict.pth', map_location='cpu', weights_only=True)
    return meta, state_dict, case


def _arch_of(meta: dict) -> dict:
    kw = meta['official_kwargs']
    keys = ('embed_dims', 'depths', 'num_heads', 'mlp_ratios', 'sr_ratios', 'num_conv')
    return {k: kw[k] for k in keys}


@pytest.mark.parametrize('arch', ['t', 's', 'b'])
def test_presets_have_the_official_parameter_counts(arch):
    official = json.loads((DATA / 'param_counts.json').read_text())['variants'][f'shunted_{arch}']
    model = ShuntedTransformer(arch=f'shunted_{arch}')
    params = sum(p.numel() for p in model.parameters())
    # the backbone is the official model without its classifier; an ImageNet Linear head completes it
    assert params == official['num_params_without_head']
    assert params + 512 * 1000 + 1000 == official['num_params']
    assert len(model.state_dict()) + 2 == official['state_dict_keys']
    assert model.num_features == [64, 128, 256, 512]
    assert ShuntedTransformer._resolve_arch(arch) == ShuntedTransformer._resolve_arch(
        {'t': 'tiny', 's': 'small', 'b': 'base'}[arch])


def _expected_sides(side: int, odd_size: str):
    s = -(-side // 2)
    s = -(-s // 2) if odd_size == 'pad' else s // 2
    sides = [s]
    for _ in range(3):
        sides.append(-(-sides[-1] // 2))
    return sides


@pytest.mark.parametrize('odd_size, size', [('pad', (67, 93)), ('pad', (37, 130)), ('pad', (4, 9)),
                                            ('floor', (67, 93)), ('floor', (45, 77))])
@pytest.mark.parametrize('out_indices', [(0, 1, 2, 3), (0, ), (1, ), (2, ), (3, ), (1, 3)])
def test_odd_input_sizes(odd_size, size, out_indices):
    model = _tiny(odd_size=odd_size, out_indices=out_indices).eval()
    with torch.no_grad():
        outs = model(torch.randn(1, 3, *size))
    hs, ws = _expected_sides(size[0], odd_size), _expected_sides(size[1], odd_size)
    assert len(outs) == len(out_indices)
    for out, i in zip(outs, out_indices):
        assert tuple(out.shape) == (1, TINY['embed_dims'][i], hs[i], ws[i])
        assert torch.isfinite(out).all()
    if odd_size == 'pad':
        assert [hs[i] for i in range(4)] == [-(-size[0] // 2 ** (i + 2)) for i in range(4)]


def test_pad_and_floor_agree_when_sizes_divide_and_differ_otherwise():
    pad = _tiny().double().eval()
    floor = _tiny(odd_size='floor').double().eval()
    floor.load_state_dict(pad.state_dict())
    with torch.no_grad():
        x = torch.randn(1, 3, 64, 96, dtype=torch.float64)
        assert all(torch.equal(a, b) for a, b in zip(pad(x), floor(x)))
        # 72 rows: an 18-row stage-1 map, whose last 2 rows the floor mode leaves out of the rate-8 keys
        x = torch.randn(1, 3, 72, 96, dtype=torch.float64)
        a, b = pad(x)[0], floor(x)[0]
    assert a.shape == b.shape
    assert (a - b).abs().max() > 1e-3


def _official_order_attention(attn: ShuntedAttention, x: torch.Tensor, size):
    """The official shunted attention written with explicit channel slices instead of reshapes/permutes:
    query heads [0, h/2) use the coarse tokens, the first half of kv1's outputs are keys, value images have
    channel = head * head_dim + d, and the coarse output fills the first C/2 channels."""
    B, N, C = x.shape
    h, d, half = attn.num_heads, attn.head_dim, C // 2
    q = attn.q(x)
    image = x.transpose(1, 2).reshape(B, C, *size)
    outs = []
    for g, group in enumerate(attn.groups):
        reduced = group.sr(image)
        grid = reduced.shape[-2:]
        tokens = F.gelu(group.norm(reduced.flatten(2).transpose(1, 2)))
        kv = group.kv(tokens)
        keys, values = kv[..., :half], kv[..., half:]
        values = values + group.local_conv(values.transpose(1, 2).reshape(B, half, *grid)).flatten(2).transpose(1, 2)
        out = []
        for head in range(h // 2):
            qh = q[..., (g * h // 2 + head) * d:(g * h // 2 + head + 1) * d]
            kh, vh = keys[..., head * d:(head + 1) * d], values[..., head * d:(head + 1) * d]
            out.append(torch.softmax(qh @ kh.transpose(1, 2) * d ** -0.5, dim=-1) @ vh)
        outs.append(torch.cat(out, dim=-1))
    return attn.proj(torch.cat(outs, dim=-1))


@pytest.mark.parametrize('fused', [False, True], ids=['explicit', 'sdpa'])
def test_head_groups_follow_the_official_order(fused):
    torch.manual_seed(0)
    attn = ShuntedAttention(32, 4, rates=(4, 2), qkv_bias=True, fused=fused).double().eval()
    with torch.no_grad():
        for p in attn.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    x = torch.randn(2, 8 * 12, 32, dtype=torch.float64)
    with torch.no_grad():
        ours, ref = attn(x, (8, 12)), _official_order_attention(attn, x, (8, 12))
    assert (ours - ref).abs().max() < 1e-12

    # silencing the fine group's values (with proj = identity) empties exactly the last C/2 channels
    with torch.no_grad():
        fine = attn.groups[1]
        fine.kv.weight[16:] = 0
        fine.kv.bias[16:] = 0
        fine.local_conv.weight.zero_()
        fine.local_conv.bias.zero_()
        attn.proj.weight.copy_(torch.eye(32))
        attn.proj.bias.zero_()
        out = attn(x, (8, 12))
    assert out[..., 16:].abs().max() == 0
    assert out[..., :16].abs().min() > 0


def test_sdpa_equals_explicit_path():
    model = _tiny().double().eval()
    with torch.no_grad():
        x = torch.randn(2, 3, 67, 93, dtype=torch.float64)
        fused = model(x)
        for m in model.modules():
            if isinstance(m, ShuntedAttention):
                m.fused = False
        explicit = model(x)
    for a, b in zip(fused, explicit):
        assert (a - b).abs().max() / b.abs().max() < 1e-12
    assert not _tiny(fused_attn=False).stages[0].blocks[0].attn.fused


def test_with_cp_same_output_and_gradients():
    plain = _tiny()
    ckpt = _tiny(with_cp=True)
    ckpt.load_state_dict(plain.state_dict())
    x = torch.randn(2, 3, 64, 70)
    results = []
    for model in (plain, ckpt):
        model.train()
        outs = model(x)
        sum(o.pow(2).mean() for o in outs).backward()
        results.append((outs, {n: p.grad.clone() for n, p in model.named_parameters()}))
    (outs_a, grads_a), (outs_b, grads_b) = results
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(outs_a, outs_b))
    assert grads_a.keys() == grads_b.keys()
    for name in grads_a:
        assert torch.allclose(grads_a[name], grads_b[name], atol=1e-6), name
    assert grads_a['stages.3.blocks.0.attn.kv.weight'].abs().sum() > 0


def _count_calls(modules):
    calls = {name: 0 for name in modules}

    def hook(name):
        def count(module, args):
            calls[name] += 1
        return count

    # pre-hooks: the recomputation stops as soon as it has what the backward needs, before forward hooks run
    for name, module in modules.items():
        module.register_forward_pre_hook(hook(name))
    return calls


def _train_step(model, xs):
    model.train()
    outs = [model(x) for x in xs]
    sum(o.pow(2).mean() for out in outs for o in out).backward()
    return outs


@pytest.mark.parametrize('forwards', [1, 2])
def test_with_cp_recomputes_the_stem_but_updates_batchnorm_statistics_once(forwards):
    # two forward passes before one backward (gradient accumulation in one graph) must keep both updates
    arch = dict(TINY, num_conv=1)
    torch.manual_seed(0)
    plain = ShuntedTransformer(arch=arch, drop_path_rate=0.).double()
    ckpt = ShuntedTransformer(arch=arch, drop_path_rate=0., with_cp=True).double()
    ckpt.load_state_dict(plain.state_dict())
    xs = [torch.randn(2, 3, 64, 70, dtype=torch.float64) * (i + 1) for i in range(forwards)]
    calls = {}
    for name, model in (('plain', plain), ('ckpt', ckpt)):
        calls[name] = _count_calls({'stem bn': model.stages[0].patch_embed.convs[1].bn,
                                    'embed 1': model.stages[1].patch_embed})
    outs_a, outs_b = _train_step(plain, xs), _train_step(ckpt, xs)

    # the stem (with its BatchNorms) and the patch embeddings ran again in the backward pass
    assert calls['plain'] == {'stem bn': forwards, 'embed 1': forwards}
    assert calls['ckpt'] == {'stem bn': 2 * forwards, 'embed 1': 2 * forwards}
    for out_a, out_b in zip(outs_a, outs_b):
        assert all(torch.equal(a, b) for a, b in zip(out_a, out_b))
    grads_a = {n: p.grad for n, p in plain.named_parameters()}
    grads_b = {n: p.grad for n, p in ckpt.named_parameters()}
    assert grads_a.keys() == grads_b.keys()
    for name in grads_a:
        torch.testing.assert_close(grads_b[name], grads_a[name], rtol=1e-12, atol=1e-14, msg=name)
    assert grads_a['stages.0.patch_embed.convs.0.conv.weight'].abs().sum() > 0
    buffers_a, buffers_b = dict(plain.named_buffers()), dict(ckpt.named_buffers())
    assert buffers_a.keys() == buffers_b.keys() and len(buffers_a) == 6  # two stem BatchNorms
    for name in buffers_a:
        assert torch.equal(buffers_a[name], buffers_b[name]), name
    assert ckpt.stages[0].patch_embed.convs[0].bn.num_batches_tracked.item() == forwards


def test_with_cp_leaves_inference_and_a_frozen_stem_alone():
    model = _tiny(with_cp=True, frozen_stages=0)
    calls = _count_calls({'stem': model.stages[0].patch_embed, 'embed 1': model.stages[1].patch_embed})
    _train_step(model, [torch.randn(1, 3, 32, 32)])
    # nothing of the frozen stem needs a gradient, so nothing is kept for it and it runs once
    assert calls == {'stem': 1, 'embed 1': 2}
    model.eval()
    with torch.no_grad():
        model(torch.randn(1, 3, 32, 32))
    assert calls == {'stem': 2, 'embed 1': 3}


def test_frozen_stages():
    model = _tiny(frozen_stages=0).train()
    assert not any(p.requires_grad for p in model.stages[0].patch_embed.parameters())
    assert all(p.requires_grad for p in model.stages[0].blocks.parameters())
    assert not model.stages[0].patch_embed.training and model.stages[0].blocks.training

    model = _tiny(frozen_stages=2).train()
    for i, stage in enumerate(model.stages):
        assert all(p.requires_grad != (i < 2) for p in stage.parameters())
        assert stage.training == (i >= 2)
    stem_bn = model.stages[0].patch_embed.convs[0].bn
    before = stem_bn.running_mean.clone()
    model(torch.randn(2, 3, 64, 64))
    assert torch.equal(stem_bn.running_mean, before)


def test_norm_eval_keeps_batchnorm_statistics():
    model = _tiny(norm_eval=True).train()
    stem_bn = model.stages[0].patch_embed.convs[0].bn
    assert not stem_bn.training and model.stages[1].blocks.training
    before = stem_bn.running_mean.clone()
    model(torch.randn(2, 3, 64, 64))
    assert torch.equal(stem_bn.running_mean, before)
    trained = _tiny().train()
    trained(torch.randn(2, 3, 64, 64))
    assert not torch.equal(trained.stages[0].patch_embed.convs[0].bn.running_mean, before)


def test_bad_inputs_name_the_fix():
    model = _tiny().eval()
    with pytest.raises(ValueError, match='in_channels=1'):
        model(torch.randn(1, 1, 64, 64))
    with pytest.raises(ValueError, match='at least 4x4'):
        model(torch.randn(1, 3, 3, 64))


@pytest.mark.parametrize('arch, match', [
    ('shunted_l', 'Unknown ShuntedTransformer arch'),
    (dict(TINY, sr_ratios=(6, 3, 2, 1)), 'sr_ratio must be 1 or even'),
    (dict(TINY, num_heads=(1, 2, 2, 4)), 'head group'),
    (dict(TINY, depths=(1, 1, 1)), 'one value per stage'),
])
def test_bad_arch(arch, match):
    with pytest.raises(ValueError, match=match):
        ShuntedTransformer(arch=arch)


def test_init_weights_follows_the_official_scheme():
    model = _tiny()
    fc1 = model.stages[3].blocks[0].mlp.fc1
    assert torch.all(fc1.bias == 0) and abs(fc1.weight.std().item() - 0.02) < 0.002
    assert torch.all(model.stages[1].norm.weight == 1)
    sr = model.stages[0].blocks[0].attn.groups[0].sr
    fan_out = 8 * 8 * 16
    assert abs(sr.weight.std().item() - (2 / fan_out) ** 0.5) < 0.01


def _loaded(path, meta) -> ShuntedTransformer:
    model = ShuntedTransformer(arch=_arch_of(meta), init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    model.init_weights()
    return model


def test_official_checkpoint_round_trip(tmp_path):
    meta, official, case = _case('shunted_a')
    files = {
        'flat': official,
        'model': {'model': official, 'epoch': 300},
        'state_dict': {'state_dict': {'module.' + k: v for k, v in official.items()}},
    }
    models = {}
    for name, content in files.items():
        torch.save(content, tmp_path / f'{name}.pth')
        models[name] = _loaded(tmp_path / f'{name}.pth', meta)
    reference = models['flat'].state_dict()
    assert len(reference) == len(official) - 2  # all but the classifier
    for model in models.values():
        assert all(torch.equal(v, reference[k]) for k, v in model.state_dict().items())

    # the loaded weights reproduce the official stage outputs
    images = torch.load(case / 'input.pt', weights_only=True).double()
    expected = torch.load(case / 'outputs.pt', weights_only=True)['stages']
    with torch.no_grad():
        outs = models['model'].double().eval()(images)
    for ours, theirs in zip(outs, expected):
        assert (ours - theirs).abs().max() / theirs.abs().max() < 1e-6

    # official -> mm-style file (the converter tool's path), then loaded with the backbone. prefix
    family, layout, count = convert_checkpoint_file(str(tmp_path / 'model.pth'), str(tmp_path / 'mm.pth'))
    assert (family, layout, count) == ('shunted', 'official-shunted', len(official))
    mm = torch.load(tmp_path / 'mm.pth', weights_only=True)['state_dict']
    assert torch.equal(mm['head.fc.weight'], official['head.weight'])
    loaded = _loaded(tmp_path / 'mm.pth', meta).state_dict()
    assert all(torch.equal(v, reference[k]) for k, v in loaded.items())


def test_other_official_name_layouts_convert():
    meta, official, _ = _case('shunted_b')
    # a detector trained with the official backbone class keeps SSA.py names under backbone.
    detector = {**{'backbone.' + k: v for k, v in official.items() if not k.startswith('head.')},
                'neck.lateral_convs.0.conv.weight': torch.zeros(1)}
    towhee = {k.replace('.dwconv.dwconv.', '.dwconv.'): v for k, v in official.items()}
    direct, _, _ = convert_state_dict(official, 'shunted')
    for state, layout in ((detector, 'official-shunted'), (towhee, 'towhee-shunted')):
        converted, family, found = convert_state_dict(state, 'shunted')
        assert found == layout
        for key, value in converted.items():
            if key.startswith('backbone.'):
                assert torch.equal(value, direct[key])
    # stem BatchNorm statistics and the num_conv=1 stem layout
    assert torch.equal(direct['backbone.stages.0.patch_embed.convs.1.bn.running_var'],
                       official['patch_embed1.conv.4.running_var'])
    assert torch.equal(direct['backbone.stages.0.patch_embed.proj.weight'], official['patch_embed1.conv.6.weight'])


def test_unusable_checkpoints_raise(tmp_path):
    meta, official, _ = _case('shunted_a')
    torch.save({'ema_weights': official}, tmp_path / 'unknown_wrapper.pth')
    with pytest.raises(CheckpointMismatchError, match='not recognised'):
        _loaded(tmp_path / 'unknown_wrapper.pth', meta)
    torch.save(official, tmp_path / 'official_a.pth')
    # the shunted_a weights (widths 64/32/64/32) do not fit Shunted-T
    model = ShuntedTransformer(arch='t', init_cfg=dict(type='Pretrained', checkpoint=str(tmp_path / 'official_a.pth')))
    with pytest.raises(CheckpointMismatchError, match='another shape'):
        model.init_weights()
    model = ShuntedTransformer(arch=dict(_arch_of(meta), num_conv=1),
                               init_cfg=dict(type='Pretrained', checkpoint=str(tmp_path / 'official_a.pth')))
    with pytest.raises(CheckpointMismatchError, match='missing'):
        model.init_weights()


def test_parity_builder_follows_the_kwargs():
    """The fixture's widths, heads, stem depth and norm eps reach the model; a wrong eps breaks parity."""
    from mmvisatt.testing import parity_model
    meta, official, case = _case('shunted_b')
    model = parity_model(meta, official)
    backbone = model.backbone
    assert backbone.num_features == meta['official_kwargs']['embed_dims']
    assert len(backbone.stages[0].patch_embed.convs) == 1 + meta['official_kwargs']['num_conv']
    assert backbone.stages[0].norm.eps == 1e-6 and backbone.stages[0].patch_embed.norm.eps == 1e-5
    images = torch.load(case / 'input.pt', weights_only=True).double()
    ref = torch.load(case / 'outputs.pt', weights_only=True)
    for m in backbone.modules():
        if isinstance(m, nn.LayerNorm) and m.eps == 1e-5:
            m.eps = 1e-6
    with torch.no_grad():
        logits = model.double()(images)['logits']
    assert (logits - ref['logits']).abs().max() / ref['logits'].abs().max() > 1e-6
