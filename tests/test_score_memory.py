"""The lean score path of pooling attention (``lean_scores``, the default of ReViT and ReMViTv2).

It must be the plain autograd computation (``lean_scores=False``, the reference) in every value (forward bit for
bit, gradients to float64 rounding) and must keep fewer score-sized tensors for the backward: at 800x1216 that
takes ReMViTv2-T's training peak from 18 GB to under 8 GB.
"""
import copy

import pytest
import torch

from mmvisatt.models.backbones import ReMViTv2, ReViT
from mmvisatt.models.layers.pooling_attention import PoolingResidualAttention
from mmvisatt.models.layers.residual_attention import PooledScores, TokenGrid

F64 = torch.float64

# (name, module kwargs, previous scores (heads, q grid, kv grid) or None)
CASES = {
    'first_layer_rel_pos': (dict(num_heads=2, pool_kernel=(3, 3), stride_q=(1, 1), stride_kv=(2, 2),
                                 rel_pos_size=15), None),
    'same_grids_and_heads': (dict(num_heads=2, pool_kernel=(3, 3), stride_q=(1, 1), stride_kv=(2, 2),
                                  rel_pos_size=15), (2, TokenGrid(8, 8, 1, 1), TokenGrid(4, 4, 2, 2))),
    'heads_change_from_one_pooled_queries': (dict(num_heads=2, pool_kernel=(3, 3), stride_q=(2, 2), stride_kv=(2, 2),
                                                  rel_pos_size=7), (1, TokenGrid(8, 8, 1, 1), TokenGrid(4, 4, 2, 2))),
    'heads_change_keys_repeat': (dict(num_heads=4, pool_kernel=(3, 3), stride_q=(1, 1), stride_kv=(2, 2),
                                      rel_pos_size=15), (2, TokenGrid(8, 8, 1, 1), TokenGrid(2, 2, 4, 4))),
    'no_rel_pos': (dict(num_heads=2, pool_kernel=(3, 3), stride_q=(2, 2), stride_kv=(2, 2)),
                   (2, TokenGrid(8, 8, 1, 1), TokenGrid(4, 4, 2, 2))),
    'plain_vit': (dict(num_heads=2), (2, TokenGrid(8, 8, 1, 1), TokenGrid(8, 8, 1, 1))),
}


def _pair(case: str, mode: str = 'aligned', dtype=F64):
    kwargs, _ = CASES[case]
    torch.manual_seed(0)
    plain = PoolingResidualAttention(8, 16, residual_pooling=True, residual_mode=mode, lean_scores=False,
                                     **kwargs).to(dtype)
    with torch.no_grad():
        for p in plain.parameters():
            p.normal_(0, 0.3)
    lean = copy.deepcopy(plain)
    lean.lean_scores = True
    return plain, lean


def _inputs(case: str, alpha_kind: str, dtype=F64):
    _, prev = CASES[case]
    x = torch.randn(2, 8, 8, 8, dtype=dtype, requires_grad=True)
    residual = None
    if prev is not None:
        heads, q_grid, kv_grid = prev
        scores = torch.randn(2, heads, q_grid.num_tokens, kv_grid.num_tokens, dtype=dtype, requires_grad=True)
        residual = PooledScores(scores, q_grid, kv_grid)
    alpha = torch.tensor([0.3], dtype=dtype, requires_grad=True) if alpha_kind == 'param' else 0.3
    return x, residual, alpha


def _run(module, x, residual, alpha):
    out, carried = module(x, residual, alpha)
    # weigh the carried scores so their gradient path (into the next layer) is tested as well
    weights = torch.linspace(-1, 1, carried.scores.shape[-1], dtype=carried.scores.dtype)
    loss = out.square().sum() + (carried.scores * weights).sum()
    wrt = [*module.parameters(), x] + ([residual.scores] if residual is not None else [])
    wrt += [alpha] if torch.is_tensor(alpha) else []
    return out, carried.scores, torch.autograd.grad(loss, wrt, allow_unused=True)


@pytest.mark.parametrize('alpha_kind', ['param', 'float'])
@pytest.mark.parametrize('case', sorted(CASES))
def test_lean_path_is_the_plain_computation(case, alpha_kind, chunking):
    plain, lean = _pair(case)
    x, residual, alpha = _inputs(case, alpha_kind)
    out_a, scores_a, grads_a = _run(plain, x, residual, alpha)
    out_b, scores_b, grads_b = _run(lean, x, residual, alpha)
    assert torch.equal(out_a, out_b) and torch.equal(scores_a, scores_b)
    for a, b in zip(grads_a, grads_b, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize('case', ['heads_change_from_one_pooled_queries', 'same_grids_and_heads'])
def test_lean_path_official_alignment(case):
    plain, lean = _pair(case, mode='official')
    x, residual, alpha = _inputs(case, 'param')
    out_a, scores_a, grads_a = _run(plain, x, residual, alpha)
    out_b, scores_b, grads_b = _run(lean, x, residual, alpha)
    assert torch.equal(out_a, out_b) and torch.equal(scores_a, scores_b)
    for a, b in zip(grads_a, grads_b, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize('alpha_kind', ['param', 'float'])
def test_lean_path_under_bf16_autocast(alpha_kind):
    case = 'heads_change_from_one_pooled_queries'
    plain, lean = _pair(case, dtype=torch.float32)
    x, residual, alpha = _inputs(case, alpha_kind, dtype=torch.float32)
    results = []
    for module in (plain, lean):
        with torch.autocast('cpu', dtype=torch.bfloat16):
            out, carried = module(x, residual, alpha)
        loss = out.float().square().sum() + carried.scores.float().sum()
        wrt = [*module.parameters(), x, residual.scores] + ([alpha] if torch.is_tensor(alpha) else [])
        results.append((out, carried.scores, torch.autograd.grad(loss, wrt)))
    (out_a, scores_a, grads_a), (out_b, scores_b, grads_b) = results
    assert out_a.dtype == out_b.dtype and scores_a.dtype == scores_b.dtype
    assert torch.equal(out_a, out_b) and torch.equal(scores_a, scores_b)
    for a, b in zip(grads_a, grads_b, strict=True):
        assert a.dtype == b.dtype
        # the lean backward sums its row chunks in float32 where autograd's bf16 matmuls round: bf16 noise only
        assert ((a.float() - b.float()).norm() / a.float().norm().clamp(min=1e-12)).item() < 3e-2


def test_lean_path_in_inference_equals_plain():
    plain, lean = _pair('heads_change_from_one_pooled_queries')
    x, residual, alpha = _inputs('heads_change_from_one_pooled_queries', 'param')
    with torch.no_grad():
        out_a, scores_a = plain(x, residual, alpha)
        out_b, scores_b = lean(x, residual, alpha)
    assert torch.equal(out_a, out_b) and torch.equal(scores_a.scores, scores_b.scores)
    assert scores_b.scores.grad_fn is None


def _score_sized_saved(module, x, residual, alpha) -> int:
    """Distinct storages saved for the backward that hold at least one head's score map, besides the previous
    scores (the previous layer's output, alive anyway)."""
    out, carried = module(x, residual, alpha)  # the sizes of this layer's score maps
    one_head = carried.scores[:, :1].numel()
    excluded = {residual.scores.untyped_storage().data_ptr()}
    storages = set()

    def pack(t):
        if t.numel() >= one_head and t.untyped_storage().data_ptr() not in excluded:
            storages.add(t.untyped_storage().data_ptr())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out, carried = module(x, residual, alpha)
    return len(storages)


def test_lean_path_saves_one_score_sized_tensor():
    # a map large against the channels, as at detection sizes, so only score maps pass the size filter
    torch.manual_seed(0)
    plain = PoolingResidualAttention(8, 16, 2, pool_kernel=(3, 3), stride_q=(2, 2), stride_kv=(2, 2),
                                     rel_pos_size=31, residual_pooling=True, lean_scores=False).to(F64)
    lean = copy.deepcopy(plain)
    lean.lean_scores = True
    x = torch.randn(2, 32, 32, 8, dtype=F64, requires_grad=True)
    prev = torch.randn(2, 1, 32 * 32, 16 * 16, dtype=F64, requires_grad=True)
    residual = PooledScores(prev, TokenGrid(32, 32, 1, 1), TokenGrid(16, 16, 2, 2))
    alpha = torch.tensor([0.3], dtype=F64, requires_grad=True)
    # plain autograd: q k^T and the aligned residual (for alpha's gradient), the softmax output
    assert _score_sized_saved(plain, x, residual, alpha) >= 3
    # lean: the carried scores only, from which the backward recomputes the rest
    assert _score_sized_saved(lean, x, residual, alpha) == 1


# maps carried in every block: in training ReMViTv2 hands reducible scores on shrunk by default
# (tests/test_score_handoff.py)
BACKBONES = {
    'ReMViTv2': (ReMViTv2, dict(arch=dict(embed_dims=16, depths=(1, 1, 2, 1), num_heads=1), img_size=64,
                                handoff=False)),
    'ReMViTv2-official': (ReMViTv2, dict(arch=dict(embed_dims=16, depths=(1, 1, 2, 1), num_heads=1), img_size=64,
                                         residual_mode='official')),
    'ReMViTv2-constant-alpha': (ReMViTv2, dict(arch=dict(embed_dims=16, depths=(1, 2, 1, 1), num_heads=1),
                                               img_size=64, learnable_alpha=False, handoff=False)),
    # score tensors carried also under with_cp (its default carries factors: tests/test_score_factors.py)
    'ReViT': (ReViT, dict(arch=dict(embed_dims=32, depth=3, num_heads=4), img_size=64, carry_factors=False)),
}


@pytest.mark.parametrize('with_cp', [False, True], ids=['eager', 'with_cp'])
@pytest.mark.parametrize('name', sorted(BACKBONES))
def test_backbone_gives_the_plain_gradients(name, with_cp):
    cls, kwargs = BACKBONES[name]
    torch.manual_seed(0)
    plain = cls(drop_path_rate=0., **kwargs).to(F64)
    with torch.no_grad():
        for p in plain.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    attentions = [m for m in plain.modules() if isinstance(m, PoolingResidualAttention)]
    assert attentions and all(m.lean_scores for m in attentions)  # the default
    for m in attentions:
        m.lean_scores = False
    lean = cls(drop_path_rate=0., with_cp=with_cp, **kwargs).to(F64)
    lean.load_state_dict(plain.state_dict())
    x = torch.randn(2, 3, 64, 64, dtype=F64)
    outs, grads = [], []
    for model in (plain, lean):
        model.train()
        out = model(x)
        sum((o * torch.linspace(-1, 1, o.shape[-1], dtype=F64)).square().mean() for o in out).backward()
        outs.append(out)
        grads.append({n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    for a, b in zip(*outs, strict=True):
        assert torch.equal(a, b)
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for key in grads[0]:
        torch.testing.assert_close(grads[1][key], grads[0][key], rtol=1e-9, atol=1e-12, msg=key)


@pytest.mark.slow
def test_compiled_lean_module_equals_plain():
    """Compiled graphs trace the plain composition (see PoolingResidualAttention.forward)."""
    case = 'heads_change_from_one_pooled_queries'
    plain, lean = _pair(case, dtype=torch.float32)
    x, residual, alpha = _inputs(case, 'param', dtype=torch.float32)
    torch._dynamo.reset()
    try:
        compiled = torch.compile(lean, backend='aot_eager')
        out_a, scores_a, grads_a = _run(plain, x, residual, alpha)
        out_b, scores_b, grads_b = _run(compiled, x, residual, alpha)
    finally:
        torch._dynamo.reset()
    torch.testing.assert_close(out_b, out_a, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(scores_b, scores_a, rtol=1e-5, atol=1e-5)
    for a, b in zip(grads_a, grads_b, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
