"""Every backbone's fused attention path equals its reference path, in one place.

Every family switches paths by one constructor argument, ``fused_attn``; both models of a case share the same
weights: the fused path is ``scaled_dot_product_attention`` and the reference the explicit softmax. In the ReViT
family (ReSwin, ReViT, ReMViTv2) the fused path attends with the carried scores as the kernel's bias; the
gradients compared include alpha's.
"""
import pytest
import torch
from mmengine.registry import MODELS

from mmvisatt.models.layers.patch import map_to_tokens, tokens_to_map
from mmvisatt.testing.cases import TINY_CASES, fused_reference_pair

CASES = TINY_CASES
# float64 compares the two formulas; float32 what a user runs (the fused kernels sum in another order).
TOLERANCES = {torch.float64: dict(rtol=1e-9, atol=1e-10), torch.float32: dict(rtol=1e-4, atol=1e-4)}


def _pair(name: str, dtype: torch.dtype):
    fast_model, reference_model = fused_reference_pair(*CASES[name])
    return fast_model.to(dtype), reference_model.to(dtype)


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


@pytest.mark.parametrize('name', list(CASES))
def test_block_inputs_are_contiguous_tokens(name):
    """The residual stream reaches every block norm as contiguous channels-last tokens. A permuted conv output
    (NCHW memory read as (B, H, W, C)) is a valid input, and the same numbers come out, but every add inherits its
    layout and every norm and projection of the stage then works across strides: EVT-T at 800x1216 spent a
    quarter of its forward that way."""
    model = MODELS.build(dict(type=CASES[name][0], **CASES[name][1])).eval()
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
