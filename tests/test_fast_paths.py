"""Every backbone's fast attention path equals its explicit-softmax reference path, in one place.

The families switch paths by a constructor argument (RMT/EVT ``fused_attention``, FAN ``fused_attn``, Shunted
``attn_impl``); both models of a case share the same weights. The ReViT family carries every layer's mixed
scores to the next layer, so they are materialised whatever kernel computes the softmax: ReSwinTransformer has a
single path, and the lean score path of ReViT and ReMViTv2 is compared with its plain composition in
``test_score_memory.py``.
"""
import pytest
import torch

from mmvisatt.models.backbones import EVT, FAN, RMT, ReMViTv2, ReViT, ShuntedTransformer
from mmvisatt.models.layers.layout import map_to_tokens, tokens_to_map

SMALL = dict(embed_dims=(16, 32, 32, 64), num_heads=(2, 2, 4, 4))
CASES = {
    'rmt': (RMT, dict(arch=dict(SMALL, depths=(1, 2, 1, 1), decomposed=(True, True, False, False),
                                layer_scales=(False, False, True, True))), 'fused_attention', (True, False)),
    'evt': (EVT, dict(arch=dict(SMALL, depths=(2, 2, 1, 1))), 'fused_attention', (True, False)),
    'evt_swin': (EVT, dict(arch=dict(style='swin', embed_dims=(16, 32, 32, 64), depths=(2, 2, 2, 2),
                                     num_heads=(1, 2, 2, 4))), 'fused_attention', (True, False)),
    'shunted': (ShuntedTransformer, dict(arch=dict(SMALL, depths=(1, 1, 1, 1), mlp_ratios=(2, 2, 2, 2),
                                                   sr_ratios=(8, 4, 2, 1))), 'attn_impl', ('sdpa', 'explicit')),
    'fan_vit': (FAN, dict(arch=dict(form='vit', embed_dims=32, depth=2, num_heads=2)), 'fused_attn', (True, False)),
    'fan_hybrid': (FAN, dict(arch=dict(form='hybrid', embed_dims=32, depth=3, num_heads=2, stem_depths=(1, 1),
                                       stem_dims=(16, 24), out_block=1, down_channels=40)), 'fused_attn',
                   (True, False)),
    'fan_swin': (FAN, dict(arch=dict(form='swin', embed_dims=16, depths=(1, 2, 1, 1), num_heads=(1, 2, 2, 4))),
                 'fused_attn', (True, False)),
}
# float64 compares the two formulas; float32 what a user runs (the fused kernels sum in another order).
TOLERANCES = {torch.float64: dict(rtol=1e-9, atol=1e-10), torch.float32: dict(rtol=1e-4, atol=1e-4)}


def _pair(name: str, dtype: torch.dtype):
    cls, kwargs, switch, (fast, reference) = CASES[name]
    torch.manual_seed(0)
    fast_model = cls(drop_path_rate=0., **{switch: fast}, **kwargs)
    with torch.no_grad():
        # weights away from their identity-like initial values (layer scales of 1e-6 would hide attention)
        for p in fast_model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
        # and running statistics away from (0, 1), which a fast path folding its norms could get wrong unseen
        for m in fast_model.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2)
    reference_model = cls(drop_path_rate=0., **{switch: reference}, **kwargs)
    reference_model.load_state_dict(fast_model.state_dict())
    return fast_model.to(dtype).eval(), reference_model.to(dtype).eval()


@pytest.mark.parametrize('dtype', [torch.float64, torch.float32], ids=['float64', 'float32'])
@pytest.mark.parametrize('name', list(CASES))
def test_fast_path_equals_reference(name, dtype):
    fast, reference = _pair(name, dtype)
    # odd sizes: padding of windows/groups and ragged pooled maps are on the path too; two images, since FAN-Swin's
    # windows join the batch in the fused path (the gradient test below runs one)
    x = torch.randn(2, 3, 70, 45, dtype=dtype)
    with torch.no_grad():
        outs, refs = fast(x), reference(x)
    assert len(outs) == len(refs) == 4
    for out, ref in zip(outs, refs):
        assert out.shape == ref.shape
        torch.testing.assert_close(out, ref, **TOLERANCES[dtype])


@pytest.mark.parametrize('name', list(CASES))
def test_fast_path_gradients_equal_reference(name):
    fast, reference = _pair(name, torch.float64)
    x = torch.randn(1, 3, 48, 40, dtype=torch.float64)
    grads = []
    for model in (fast, reference):
        model.train()
        sum(out.square().mean() for out in model(x)).backward()
        grads.append({n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for key in grads[0]:
        torch.testing.assert_close(grads[0][key], grads[1][key], rtol=1e-7, atol=1e-9, msg=key)


STREAM_CASES = {
    **{name: (cls, kwargs) for name, (cls, kwargs, _, _) in CASES.items()},
    'revit': (ReViT, dict(arch=dict(embed_dims=32, depth=2, num_heads=2))),
    'remvit': (ReMViTv2, dict(arch=dict(embed_dims=16, depths=(1, 1, 1, 1), num_heads=1))),
}


@pytest.mark.parametrize('name', list(STREAM_CASES))
def test_block_inputs_are_contiguous_tokens(name):
    """The residual stream reaches every block norm as contiguous channels-last tokens. A permuted conv output
    (NCHW memory read as (B, H, W, C)) is a valid input, and the same numbers come out, but every add inherits its
    layout and every norm and projection of the stage then works across strides: EVT-T at 800x1216 spent a
    quarter of its forward that way."""
    cls, kwargs = STREAM_CASES[name]
    model = cls(**kwargs).eval()
    strided = []
    norms = [(n, m) for n, m in model.named_modules()
             if isinstance(m, torch.nn.LayerNorm) and 'blocks' in n and n.rsplit('.', 1)[-1] in ('norm1', 'norm2')]
    assert norms
    for n, m in norms:
        m.register_forward_pre_hook(lambda mod, args, n=n: strided.append(n) if not args[0].is_contiguous() else None)
    with torch.no_grad():
        model(torch.randn(1, 3, 70, 45))
    assert not strided


@pytest.mark.parametrize('batch', [1, 2])
def test_token_maps_are_channels_last_views(batch):
    """FAN's and Shunted's convolutions over tokens get a channels-last view, for one image too (where a reshaped
    transpose has a batch stride of C and convolutions copy it to NCHW), and give tokens back without a copy."""
    x = torch.randn(batch, 6 * 5, 8)
    image = tokens_to_map(x, (6, 5))
    assert image.shape == (batch, 8, 6, 5) and image.data_ptr() == x.data_ptr()
    assert image.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(image, x.transpose(1, 2).reshape(batch, 8, 6, 5), rtol=0, atol=0)
    conv = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8)
    with torch.no_grad():
        out = conv(image)
    assert out.is_contiguous(memory_format=torch.channels_last)
    tokens = map_to_tokens(out)
    assert tokens.data_ptr() == out.data_ptr()
    torch.testing.assert_close(tokens, out.flatten(2).transpose(1, 2), rtol=0, atol=0)


STRIP_CASES = ['rmt', 'evt', 'evt_swin', 'fan_vit', 'fan_hybrid', 'fan_swin']


@pytest.fixture
def strips_everywhere(monkeypatch):
    """Row strips for every map (the size thresholds at 0, strips of two rows), counting the strip loops run."""
    from mmvisatt.models.backbones import evt, fan, rmt
    from mmvisatt.models.layers import channel_attention, strips
    monkeypatch.setattr(strips, 'SPLIT_BYTES', 0)
    monkeypatch.setattr(strips, 'STRIP_BYTES', 0)
    monkeypatch.setattr(strips, 'MIN_ROWS', 2)
    runs = []

    def counted(*args):
        runs.append(args)
        return strips.row_strips(*args)

    for module in (rmt, evt, fan, channel_attention):
        monkeypatch.setattr(module, 'row_strips', counted)
    return runs


@pytest.mark.parametrize('name', STRIP_CASES)
def test_fast_path_in_strips_equals_reference(name, strips_everywhere):
    """Inference by row strips (the wide MLPs a band of rows at a time, with the conv halos) gives the reference
    numbers: here every map, down to two-row strips, so the halo rows and image borders are all exercised."""
    fast, reference = _pair(name, torch.float64)
    x = torch.randn(2, 3, 70, 45, dtype=torch.float64)
    with torch.no_grad():
        outs, refs = fast(x), reference(x)
    assert strips_everywhere
    for out, ref in zip(outs, refs):
        torch.testing.assert_close(out, ref, **TOLERANCES[torch.float64])


@pytest.mark.parametrize('name', STRIP_CASES)
def test_strips_stay_off_under_autograd(name, strips_everywhere):
    """A backward would keep every strip's activations: with autograd on, the wide maps are built whole."""
    fast, reference = _pair(name, torch.float64)
    x = torch.randn(1, 3, 48, 40, dtype=torch.float64)
    outs, refs = fast(x), reference(x)
    assert not strips_everywhere
    for out, ref in zip(outs, refs):
        torch.testing.assert_close(out, ref, **TOLERANCES[torch.float64])


@pytest.mark.parametrize('name', ['evt_swin', 'fan_swin'])
def test_strips_stay_off_in_training_mode(name, strips_everywhere):
    """In training mode BatchNorm takes batch statistics and dropout / drop path are live, which strips would
    change (RMT's FFN has neither, and strips there give the same numbers in either mode)."""
    fast, _ = _pair(name, torch.float64)
    fast.train()
    with torch.no_grad():
        fast(torch.randn(1, 3, 48, 40, dtype=torch.float64))
    assert not strips_everywhere


def test_window_gather_is_the_window_partition():
    from mmvisatt.models.layers.window import (WindowGrid, partition_windows, window_attention_mask,
                                               window_gather)
    grid = WindowGrid.build(10, 16, 4, 2)  # padded to 12 x 16 and shifted
    batch, N = 2, grid.window_area
    x = torch.arange(batch * 10 * 16, dtype=torch.float64).view(batch, 10, 16, 1) + 1
    gather = window_gather(grid, batch)
    padded = torch.nn.functional.pad(x, (0, 0, 0, 0, 0, 2)).reshape(-1)
    windows = padded[gather.tokens].view(-1, N)
    reference = partition_windows(x, grid).view(batch, grid.num_windows, N)
    mask = window_attention_mask(grid)
    plain = (mask == 0).flatten(1).all(1)
    # plain windows of every image first, then the masked ones, each group in window order
    expected = torch.cat([reference[:, plain].reshape(-1, N), reference[:, ~plain].reshape(-1, N)])
    torch.testing.assert_close(windows, expected, rtol=0, atol=0)
    assert gather.plain == batch * int(plain.sum())
    torch.testing.assert_close(gather.masks, mask[~plain].repeat(batch, 1, 1), rtol=0, atol=0)
    # every real token comes back from its slot; padded slots are never read
    torch.testing.assert_close(windows.reshape(-1)[gather.inverse], x.reshape(-1), rtol=0, atol=0)
    assert window_gather(grid, batch) is gather
