"""The fast path's residual forms of RMT/EVT blocks equal the literal sums the reference path writes.

``residual_depthwise(fold=True)`` puts ``x + conv(x)`` into one convolution, ``add_into`` adds a residual into a
map the block just made, ``ConvFFN`` and ``ConvStem`` run GELU in place when no backward will need its input, and
``conv_norm`` folds a BatchNorm that uses running statistics into its conv. Whole-model
equality with the reference path is in ``test_fast_paths.py``; these check the pieces where they can differ:
gradients through the folded kernel, drop path and layer scale in training, autocast, and memory reuse.
"""
import pytest
import torch
import torch.nn as nn

from mmvisatt.models.backbones import EVT
from mmvisatt.models.backbones.rmt import (ConvDownsample, ConvFFN, ConvStem, ManhattanSelfAttention, RasterRotary,
                                           RetentiveBlock, conv_norm, residual_depthwise)
from mmvisatt.models.layers.inplace import add_into, gelu_into
from mmvisatt.models.layers.spatial_decay import SpatialDecay


@pytest.mark.parametrize('kernel', [3, 5])
def test_folded_depthwise_equals_sum_with_gradients(kernel):
    torch.manual_seed(0)
    conv = nn.Conv2d(6, 6, kernel, 1, kernel // 2, groups=6).double()
    x = torch.randn(2, 7, 5, 6, dtype=torch.float64, requires_grad=True)
    results = []
    for fold in (True, False):
        conv.zero_grad()
        x.grad = None
        out = residual_depthwise(conv, x, fold)
        out.mul(torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
        results.append((out.detach(), x.grad.clone(), conv.weight.grad.clone(), conv.bias.grad.clone()))
    for folded, literal in zip(*results):
        torch.testing.assert_close(folded, literal, rtol=1e-12, atol=1e-12)
    assert results[0][0].is_contiguous()


def test_add_into_reuses_the_fresh_map_only_when_the_sum_is_the_same_tensor():
    x = torch.randn(2, 3, 4)
    fresh = torch.randn(2, 3, 4)
    expected = x + fresh
    pointer = fresh.data_ptr()
    out = add_into(fresh, x)
    assert out.data_ptr() == pointer
    assert torch.equal(out, expected)  # addition commutes: bit-identical

    # autocast: a half-precision output must not swallow a float32 residual
    half = torch.randn(2, 3, 4).bfloat16()
    out = add_into(half, x)
    assert out.dtype == torch.float32 and out.data_ptr() != half.data_ptr()
    torch.testing.assert_close(out, x + half.float())

    # broadcasting would change the fresh map's shape
    row = torch.randn(4)
    out = add_into(row, x)
    assert out.shape == x.shape and torch.equal(out, x + row)
    # a smaller operand that broadcasts into the fresh map (relative-position terms into the scores) goes in place
    fresh = torch.randn(2, 3, 4)
    expected = fresh + row
    assert add_into(fresh, row).data_ptr() == fresh.data_ptr() and torch.equal(fresh, expected)


def _block_pair(layer_scale, drop_path):
    torch.manual_seed(0)
    blocks = [RetentiveBlock(16, ManhattanSelfAttention(16, 2), 3., drop_path, layer_scale, fold=fold).double()
              for fold in (True, False)]
    with torch.no_grad():
        for p in blocks[0].parameters():
            p.add_(torch.randn_like(p) * 0.05)
    blocks[1].load_state_dict(blocks[0].state_dict())
    return blocks


@pytest.mark.parametrize('layer_scale', [None, 0.5])
def test_folded_block_trains_like_the_literal_one(layer_scale):
    """Drop path and layer scale sit between the fresh map and the residual add; the same seed draws the same
    drop-path masks on both paths, so outputs and every gradient must agree."""
    blocks = _block_pair(layer_scale, drop_path=0.5)
    x = torch.randn(4, 6, 5, 16, dtype=torch.float64)
    H, W = x.shape[1:3]
    results = []
    for block in blocks:
        block.train()
        context = _masa_context(H, W)
        inp = x.clone().requires_grad_()
        torch.manual_seed(1)
        out = block(inp, *context)
        out.square().mean().backward()
        results.append((out.detach(), inp.grad, {n: p.grad for n, p in block.named_parameters()}))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(results[0][1], results[1][1], rtol=1e-9, atol=1e-12)
    for name, grad in results[0][2].items():
        torch.testing.assert_close(grad, results[1][2][name], rtol=1e-9, atol=1e-12, msg=name)


def _masa_context(height, width):
    sin, cos = RasterRotary(8).double()(height, width, torch.float64)
    bias = SpatialDecay(2).double().grid(height, width, 'manhattan', torch.float64)
    return sin, cos, bias


def test_ffn_gelu_in_place_only_without_autograd():
    torch.manual_seed(0)
    ffn = ConvFFN(8, 24, fold=True).double()
    x = torch.randn(2, 5, 6, 8, dtype=torch.float64)
    with torch.no_grad():
        expected = ConvFFN.forward(_literal(ffn), x)
        torch.testing.assert_close(ffn(x), expected, rtol=1e-12, atol=1e-12)
    with torch.inference_mode():
        torch.testing.assert_close(ffn(x), expected, rtol=1e-12, atol=1e-12)
    # with autograd GELU must keep fc1's output for its backward
    inp = x.clone().requires_grad_()
    ffn(inp).sum().backward()
    literal = _literal(ffn)
    inp2 = x.clone().requires_grad_()
    literal(inp2).sum().backward()
    torch.testing.assert_close(inp.grad, inp2.grad, rtol=1e-10, atol=1e-12)


def _literal(ffn):
    twin = ConvFFN(ffn.fc1.in_features, ffn.fc1.out_features, fold=False).double()
    twin.load_state_dict(ffn.state_dict())
    return twin


def test_fast_evt_under_bfloat16_autocast_matches_its_literal_forms():
    """Autocast mixes bfloat16 maps with float32 ones (norm outputs, the stem under some policies): each residual
    stream must keep the dtype the literal adds give it."""
    torch.manual_seed(0)
    arch = dict(embed_dims=(16, 32, 32, 64), num_heads=(2, 2, 4, 4), depths=(2, 2, 1, 1))
    model = EVT(arch=arch, drop_path_rate=0.).eval()
    x = torch.randn(1, 3, 64, 64)
    outs, streams = {}, {True: [], False: []}
    fold = True
    for module in model.modules():
        if isinstance(module, RetentiveBlock):
            # the residual stream as each block receives it
            module.register_forward_pre_hook(lambda mod, args: streams[fold].append(args[0].dtype))
    for fold in (True, False):
        for module in model.modules():
            if isinstance(module, (RetentiveBlock, ConvFFN)):
                module.fold = fold
            elif isinstance(module, (ConvStem, ConvDownsample)):
                module.fast = fold
        with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16):
            outs[fold] = model(x)
    assert streams[True] == streams[False]
    for folded, literal in zip(outs[True], outs[False]):
        assert folded.dtype == literal.dtype
        torch.testing.assert_close(folded.float(), literal.float(), rtol=0.05, atol=0.05)


def _conv_bn(bias, affine):
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 5, 3, 2, 1, bias=bias).double()
    norm = nn.BatchNorm2d(5, affine=affine).double()
    with torch.no_grad():
        norm.running_mean.uniform_(-1, 1)
        norm.running_var.uniform_(0.2, 3)
        if affine:
            norm.weight.uniform_(0.5, 2)
            norm.bias.uniform_(-1, 1)
    return conv, norm


@pytest.mark.parametrize('bias,affine', [(True, True), (False, True), (True, False)])
def test_folded_norm_equals_conv_then_norm_with_gradients(bias, affine):
    conv, norm = _conv_bn(bias, affine)
    norm.eval()  # running statistics: what eval and norm_eval give
    x = torch.randn(2, 3, 9, 7, dtype=torch.float64, requires_grad=True)
    results = []
    for fold in (True, False):
        for p in [x, *conv.parameters(), *norm.parameters()]:
            p.grad = None
        out = conv_norm(conv, norm, x, fold)
        out.mul(torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
        results.append([out.detach(), x.grad] + [p.grad for p in [*conv.parameters(), *norm.parameters()]])
    for folded, literal in zip(*results):
        torch.testing.assert_close(folded, literal, rtol=1e-10, atol=1e-12)


def test_norm_with_batch_statistics_is_not_folded():
    """In training mode the norm normalises by the batch and updates its running statistics: both must happen."""
    conv, norm = _conv_bn(True, True)
    twin = nn.BatchNorm2d(5).double()
    twin.load_state_dict(norm.state_dict())
    x = torch.randn(2, 3, 9, 7, dtype=torch.float64)
    folded = conv_norm(conv, norm.train(), x, fold=True)
    literal = twin.train()(conv(x))
    torch.testing.assert_close(folded, literal, rtol=0, atol=0)
    torch.testing.assert_close(norm.running_mean, twin.running_mean, rtol=0, atol=0)
    assert int(norm.num_batches_tracked) == 1


def test_gelu_into_overwrites_only_without_autograd():
    x = torch.randn(4, 5)
    expected = torch.nn.functional.gelu(x)
    fresh = x.clone()
    with torch.no_grad():
        out = gelu_into(fresh)
    assert out.data_ptr() == fresh.data_ptr() and torch.equal(out, expected)
    leaf = x.clone().requires_grad_()
    fresh = leaf * 1
    out = gelu_into(fresh)
    assert out.data_ptr() != fresh.data_ptr() and torch.equal(fresh, x)
    out.sum().backward()
    torch.testing.assert_close(leaf.grad, torch.func.grad(lambda t: torch.nn.functional.gelu(t).sum())(x))


@pytest.mark.parametrize('grad', [False, True])
def test_folded_stem_and_downsampling_equal_the_modules(grad):
    """The stem and downsampling of the fast path in eval (folded norms, in-place GELU without autograd) give the
    reference modules' outputs and, with autograd, their gradients."""
    torch.manual_seed(0)
    modules = {}
    for fold in (True, False):
        torch.manual_seed(0)
        modules[fold] = nn.Sequential(ConvStem(3, 8, fast=fold), ConvDownsample(8, 16, fast=fold)).double()
    with torch.no_grad():
        for m in modules[True].modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-1, 1)
                m.running_var.uniform_(0.2, 3)
                m.weight.uniform_(0.5, 2)
    modules[False].load_state_dict(modules[True].state_dict())
    x = torch.randn(2, 3, 19, 22, dtype=torch.float64)
    results = {}
    for fold, module in modules.items():
        module.eval()
        inp = x.clone().requires_grad_(grad)
        with torch.set_grad_enabled(grad):
            out = module(inp)
        assert out.shape == (2, 3, 3, 16) and out.is_contiguous()
        grads = []
        if grad:
            out.square().sum().backward()
            grads = [inp.grad] + [p.grad for p in module.parameters()]
        results[fold] = [out.detach()] + grads
    for folded, literal in zip(results[True], results[False]):
        torch.testing.assert_close(folded, literal, rtol=1e-10, atol=1e-12)
