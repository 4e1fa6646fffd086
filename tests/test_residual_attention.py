"""The two paths of residual attention (``residual_attention``): the fused one (``scaled_dot_product_attention`` with
the mixed residual as its bias, the carried map one ``baddbmm``) gives the reference's output and carried scores,
and every gradient, alpha's included, for every combination of terms the three backbones pass."""
import pytest
import torch
from torch.utils._pytree import tree_leaves

from mmvisatt.models.layers.residual_attention import residual_attention
from mmvisatt.testing.cases import fused_reference_pair

F64 = torch.float64
# name -> (leading dims, Nq, Nk) with the terms a backbone passes: ReViT (no bias), ReMViTv2 (decomposed relative
# positions, pooled keys, a head-mean residual), ReSwin (windows as a leading dim, the window bias, the shift mask,
# a partial mix)
FORMS = {
    'revit': dict(lead=(2, 3), nq=12, nk=12),
    'remvit': dict(lead=(2, 3), nq=12, nk=6, rel=(3, 2), prev_heads=1),
    'reswin': dict(lead=(2, 4, 3), nq=9, nk=9, bias=True, mask=True),
    'reswin_partial': dict(lead=(2, 4, 3), nq=9, nk=9, bias=True, mask=True, valid=True),
}


def _inputs(form: dict, first: bool, alpha_kind: str):
    g = torch.Generator().manual_seed(0)
    lead, nq, nk = form['lead'], form['nq'], form['nk']

    def leaf(*shape):
        return torch.randn(*shape, generator=g, dtype=F64).requires_grad_()

    q, k, v = leaf(*lead, nq, 4), leaf(*lead, nk, 4), leaf(*lead, nk, 5)
    kwargs = {}
    if form.get('rel'):
        kh, kw = form['rel']
        kwargs['rel'] = (leaf(*lead, nq, kh), leaf(*lead, nq, kw))
    if form.get('bias'):
        kwargs['bias'] = leaf(lead[-1], nq, nk)
    if form.get('mask'):
        kwargs['mask'] = torch.where(torch.rand(lead[1], 1, nq, nk, generator=g) > 0.3, 0., -100.).to(F64)
    prev = None
    if not first:
        heads = form.get('prev_heads', lead[-1])
        prev = leaf(*lead[:-1], heads, nq, nk)
        if form.get('valid'):
            kwargs['valid'] = torch.rand(lead[1], 1, nq, nk, generator=g) > 0.5
    alpha = torch.tensor([0.3], dtype=F64, requires_grad=True) if alpha_kind == 'parameter' else 0.3
    return q, k, v, prev, alpha, kwargs


@pytest.mark.parametrize('alpha_kind', ['parameter', 'float'])
@pytest.mark.parametrize('first', [True, False], ids=['first_layer', 'later_layer'])
@pytest.mark.parametrize('name', list(FORMS))
def test_fused_path_is_the_reference(name, first, alpha_kind):
    q, k, v, prev, alpha, kwargs = _inputs(FORMS[name], first, alpha_kind)
    leaves = [t for t in tree_leaves((q, k, v, prev, alpha, kwargs)) if isinstance(t, torch.Tensor) and t.requires_grad]
    results = []
    for fused in (True, False):
        out, scores = residual_attention(q, k, v, prev, alpha, fused=fused, **kwargs)
        seed = torch.Generator().manual_seed(1)
        loss = (out * torch.randn(out.shape, generator=seed, dtype=F64)).sum() + \
            (scores * torch.randn(scores.shape, generator=seed, dtype=F64)).sum()
        grads = torch.autograd.grad(loss, leaves, allow_unused=True)
        results.append((out, scores, grads))
    (out, scores, grads), (ref_out, ref_scores, ref_grads) = results
    assert out.shape == ref_out.shape and scores.shape == ref_scores.shape
    torch.testing.assert_close(out, ref_out, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(scores, ref_scores, rtol=1e-10, atol=1e-12)
    assert len(grads) == len(ref_grads) >= 3
    assert [g is None for g in grads] == [g is None for g in ref_grads]
    # q, k, v; and after the first layer prev, and alpha where it is a parameter
    assert sum(g is not None for g in grads) >= 3 + (not first) * (1 + (alpha_kind == 'parameter'))
    for grad, ref in zip(grads, ref_grads):
        if grad is not None:
            torch.testing.assert_close(grad, ref, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize('first', [True, False], ids=['first_layer', 'later_layer'])
def test_nothing_carried_is_not_made(first):
    """``carry=False`` (the factored strategy's blocks that fold nothing): the fused path makes no map and attends
    as the reference does, with factors wider than the values; gradients too."""
    q, k, v, prev, alpha, _ = _inputs(FORMS['revit'], first, 'parameter')
    q, k = torch.cat([q, 0.5 * q], -1), torch.cat([k, k], -1)  # two layers' factors: twice the values' width
    outs = []
    for fused in (True, False):
        out, scores = residual_attention(q, k, v, prev, alpha, residual_weight=0.3, fused=fused, carry=False)
        assert (scores is None) == fused
        outs.append((out, torch.autograd.grad(out.square().sum(), [q, k, v])))
    torch.testing.assert_close(outs[0][0], outs[1][0], rtol=1e-10, atol=1e-12)
    for grad, ref in zip(outs[0][1], outs[1][1]):
        torch.testing.assert_close(grad, ref, rtol=1e-9, atol=1e-11)


def test_the_residual_changes_the_result():
    """Not a formula that ignores ``prev``: the carried scores move the output (the test above can fail)."""
    q, k, v, prev, alpha, _ = _inputs(FORMS['revit'], False, 'parameter')
    for fused in (True, False):
        with_prev, _ = residual_attention(q, k, v, prev, alpha, fused=fused)
        without, _ = residual_attention(q, k, v, None, alpha, fused=fused)
        assert (with_prev - without).abs().max() > 1e-2


def test_a_bf16_map_stays_bf16_under_the_gate():
    """alpha is a (1,) parameter; as a 0-d factor it keeps bf16 maps bf16 (autocast's dtype) on either path."""
    q, k, v = (torch.randn(1, 2, 8, 4, dtype=torch.bfloat16) for _ in range(3))
    prev = torch.randn(1, 2, 8, 8, dtype=torch.bfloat16)
    alpha = torch.nn.Parameter(torch.tensor([0.5]))
    for fused in (True, False):
        out, scores = residual_attention(q, k, v, prev, alpha, fused=fused)
        assert out.dtype == scores.dtype == torch.bfloat16


# every preset of the family at full size, and the memory strategies the configs set
PRESETS = [('ReViT', 'b', {}), ('ReViT', 'b', dict(score_memory='factors')), ('ReSwinTransformer', 't', {}),
           ('ReSwinTransformer', 's', {}), ('ReSwinTransformer', 'b', {}), ('ReMViTv2', 't', {}),
           ('ReMViTv2', 't', dict(score_memory='handoff')), ('ReMViTv2', 's', {}), ('ReMViTv2', 'b', {})]


@pytest.mark.parametrize('name,arch,kwargs', PRESETS,
                         ids=[f"{n}-{a}{'-' + k['score_memory'] if k else ''}" for n, a, k in PRESETS])
def test_fused_preset_is_the_reference_at_a_non_square_size(name, arch, kwargs):
    fused, reference = (m.double() for m in fused_reference_pair(name, dict(arch=arch, **kwargs)))
    x = torch.randn(1, 3, 72, 104, dtype=F64)
    results = []
    for model in (fused, reference):
        model.train()
        outs = model(x)
        sum((o * torch.linspace(-1, 1, o.numel(), dtype=F64).view_as(o)).sum() for o in outs).backward()
        results.append((outs, {n: p.grad for n, p in model.named_parameters() if p.grad is not None}))
    (outs, grads), (ref_outs, ref_grads) = results
    for out, ref in zip(outs, ref_outs):
        assert (out - ref).abs().max() <= 1e-6 * ref.abs().max()
    assert grads.keys() == ref_grads.keys() and ('alpha' in grads) == isinstance(reference.alpha, torch.Tensor)
    for key, grad in grads.items():
        assert (grad - ref_grads[key]).abs().max() <= 1e-6 * ref_grads[key].abs().max() + 1e-12, key
