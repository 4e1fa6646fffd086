"""The attention primitive every family calls, and the one global default of the ``fused_attn`` switch."""
import pytest
import torch
from mmengine.registry import MODELS
from timm.layers import set_fused_attn, use_fused_attn

import mmvisatt.models  # noqa: F401
from mmvisatt.models.layers.attention import attention, resolve_fused_attn

TWO_PATHS = {
    'RMT': dict(embed_dims=(16, 32, 64), depths=(1, 1, 1), num_heads=(2, 2, 4)),
    'EVT': dict(embed_dims=(16, 32, 64), depths=(2, 1, 1), num_heads=(2, 2, 4)),
    'FANViT': dict(form='vit', embed_dims=32, depth=2, num_heads=2),
    'ShuntedTransformer': dict(embed_dims=(16, 32, 32, 64), depths=(1, 1, 1, 1), num_heads=(2, 2, 2, 4),
                               mlp_ratios=(2, 2, 2, 2), sr_ratios=(8, 4, 2, 1)),
    'ReSwinTransformer': dict(embed_dims=16, depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8)),
    'ReViT': dict(embed_dims=32, depth=2, num_heads=4),
    'ReMViTv2': dict(embed_dims=16, depths=(1, 2, 1, 1), num_heads=1),
}


def _explicit(q, k, v, bias, scale):
    return torch.softmax(scale * q @ k.transpose(-2, -1) + (0 if bias is None else bias), dim=-1) @ v


@pytest.mark.parametrize('bias_shape', [None, (3, 5, 7), (4, 3, 5, 7), (2, 4, 3, 5, 7), (4, 1, 5, 7)],
                         ids=['none', 'heads', 'windows', 'full', 'windows-broadcast'])
@pytest.mark.parametrize('fused', [True, False])
def test_attention_is_softmax_attention(fused, bias_shape):
    """Both paths, with (B, windows, heads) leading dims and biases varying along some of them, and a value width
    other than the key width."""
    torch.manual_seed(0)
    q = torch.randn(2, 4, 3, 5, 8, dtype=torch.float64)
    k = torch.randn(2, 4, 3, 7, 8, dtype=torch.float64)
    v = torch.randn(2, 4, 3, 7, 6, dtype=torch.float64)
    bias = None if bias_shape is None else torch.randn(*bias_shape, dtype=torch.float64)
    for scale in (None, 1.0, 0.3):
        expected = _explicit(q, k, v, bias, 8 ** -0.5 if scale is None else scale)
        torch.testing.assert_close(attention(q, k, v, bias, scale, fused=fused), expected, rtol=1e-12, atol=1e-12)


def test_attention_dropout_drops_weights_in_either_path():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 16, 4) for _ in range(3))
    for fused in (True, False):
        assert not torch.allclose(attention(q, k, v, dropout=0.5, fused=fused), attention(q, k, v, fused=fused))


@pytest.mark.parametrize('name', sorted(TWO_PATHS))
def test_fused_attn_defaults_to_the_global_setting(name):
    """``fused_attn=None`` (every config's default) follows timm's global switch, so one call flips every family;
    an explicit value wins."""
    initial = use_fused_attn()
    try:
        for setting in (False, True):
            set_fused_attn(setting)
            assert resolve_fused_attn(None) is setting
            model = MODELS.build(dict(type=name, arch=TWO_PATHS[name]))
            assert model.fused_attn is setting
            # and every attention module runs the path asked for
            flags = [getattr(m, 'fused', None) for m in model.modules()]
            flags = [f for f in flags if f is not None]
            assert flags and all(f is setting for f in flags)
            assert MODELS.build(dict(type=name, arch=TWO_PATHS[name], fused_attn=not setting)).fused_attn \
                is (not setting)
    finally:
        set_fused_attn(initial)
