"""ReViT's carried scores as factors (``ScoreFactors``, ``ReViT(carry_factors=...)``).

The factored path must be the score path's arithmetic up to rounding (outputs, every gradient including alpha's, and
the official parity fixture), must keep no score-sized tensor for the backward, and must refuse the MViTv2 blocks
whose pooling and relative positions it cannot express.
"""
import copy
import json
from pathlib import Path

import pytest
import torch

from mmvisatt.models.backbones import ReViT
from mmvisatt.models.layers import PooledScores, ScoreFactors, lean_scores, score_factors
from mmvisatt.models.layers.pooling_attention import PoolingResidualAttention
from mmvisatt.testing import parity_model

F64 = torch.float64
CASE = Path(__file__).parent / 'data/parity/revit/revit_a'
TINY = dict(arch=dict(embed_dims=32, depth=4, num_heads=4), img_size=64, drop_path_rate=0.)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


def _layers(depth: int = 4):
    torch.manual_seed(0)
    layers = torch.nn.ModuleList([PoolingResidualAttention(8, 8, 2) for _ in range(depth)]).to(F64)
    with torch.no_grad():
        for p in layers.parameters():
            p.normal_(0, 0.3)
    return layers


def _chain(layers, x, alpha, factored: bool, run=None):
    carried = ScoreFactors(run=run) if factored else None
    outs = []
    for layer in layers:
        out, carried = layer(x, carried, alpha)
        outs.append(out)
        x = x + out
    return outs, carried


def _materialise(carried: ScoreFactors, alpha: float) -> torch.Tensor:
    """The score map a ScoreFactors stands for, from its definition."""
    n = len(carried.queries)
    total = 0 if carried.base is None else (1 - alpha) ** n * carried.base.detach()
    for j, (q, k) in enumerate(zip(carried.queries, carried.keys)):
        weight = (1 - alpha) ** (n - 1 - j) * (1 if carried.base is None and j == 0 else alpha)
        total = total + weight * q.detach() @ k.detach().transpose(-2, -1)
    return total


@pytest.mark.parametrize('run', [None, 1, 2, 3])
@pytest.mark.parametrize('lean', [True, False], ids=['lean', 'plain'])
@pytest.mark.parametrize('alpha_kind', ['param', 'float'])
def test_factored_layers_are_the_score_path(alpha_kind, lean, run, chunking):
    scored = _layers()
    for layer in scored:
        layer.lean_scores = lean
    factored = copy.deepcopy(scored)
    x = torch.randn(2, 5, 7, 8, dtype=F64)
    results = []
    for layers in (scored, factored):
        alpha = torch.tensor([0.3], dtype=F64, requires_grad=True) if alpha_kind == 'param' else 0.3
        xi = x.clone().requires_grad_()
        outs, carried = _chain(layers, xi, alpha, factored=layers is factored, run=run)
        sum((o * torch.linspace(-1, 1, 8, dtype=F64)).square().sum() for o in outs).backward()
        grads = [xi.grad] + [p.grad for p in layers.parameters()]
        if torch.is_tensor(alpha):
            grads.append(alpha.grad)
        results.append((outs, carried, grads))
    (outs_a, carried_a, grads_a), (outs_b, carried_b, grads_b) = results
    for a, b in zip(outs_a, outs_b, strict=True):
        assert _rel(b, a) < 1e-12
    assert isinstance(carried_a, PooledScores) and isinstance(carried_b, ScoreFactors)
    # a map is stored after every run of layers, the factors of the layers since then are carried
    assert len(carried_b.queries) == len(carried_b.keys) == (len(scored) if run is None else len(scored) % run)
    assert (carried_b.base is None) == (run is None)
    assert _rel(_materialise(carried_b, 0.3), carried_a.scores.detach()) < 1e-12
    for a, b in zip(grads_a, grads_b, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-9, atol=1e-12)


def test_chunked_attention_gradients(monkeypatch):
    torch.manual_seed(0)
    q, k = (torch.randn(1, 2, 7, 6, dtype=F64, requires_grad=True) for _ in range(2))
    v = torch.randn(1, 2, 7, 3, dtype=F64, requires_grad=True)
    original = lean_scores.row_chunks
    monkeypatch.setattr(lean_scores, 'row_chunks', lambda rows, numel, budget: original(rows, numel, 2 * numel))
    assert len(lean_scores.row_chunks(7, 14, 1 << 22)) == 4
    assert torch.autograd.gradcheck(score_factors.ChunkedAttention.apply, (q, k, v))
    out = score_factors.ChunkedAttention.apply(q, k, v)
    assert _rel(out, (q @ k.transpose(-2, -1)).softmax(-1) @ v) < 1e-14


@pytest.mark.parametrize('alpha_kind', ['param', 'float'])
def test_factored_path_under_bf16_autocast(alpha_kind):
    scored = _layers().float()
    factored = copy.deepcopy(scored)
    x = torch.randn(2, 5, 7, 8)
    results = []
    for layers in (scored, factored):
        alpha = torch.tensor([0.3], requires_grad=True) if alpha_kind == 'param' else 0.3
        xi = x.clone().requires_grad_()
        with torch.autocast('cpu', dtype=torch.bfloat16):
            outs, _ = _chain(layers, xi, alpha, factored=layers is factored)
        sum(o.float().square().sum() for o in outs).backward()
        grads = [xi.grad] + [p.grad for p in layers.parameters()] + ([alpha.grad] if alpha_kind == 'param' else [])
        results.append((outs, grads))
    for a, b in zip(results[0][0], results[1][0], strict=True):
        assert a.dtype == b.dtype == torch.bfloat16
        assert ((a.float() - b.float()).norm() / a.float().norm()).item() < 3e-2
    for a, b in zip(results[0][1], results[1][1], strict=True):
        assert ((a.float() - b.float()).norm() / a.float().norm().clamp(min=1e-12)).item() < 5e-2


def test_factored_path_keeps_no_score_sized_tensor():
    layers = _layers(3)
    x = torch.randn(1, 16, 16, 8, dtype=F64, requires_grad=True)  # 256 tokens: a score map is 2 x 256 x 256
    alpha = torch.tensor([0.3], dtype=F64, requires_grad=True)
    largest = 0

    def pack(t):
        nonlocal largest
        largest = max(largest, t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        _chain(layers, x, alpha, factored=True)
    # the widest saved tensors are the concatenated factors of the last layer: 2 heads x 256 tokens x 3 x 4
    assert 0 < largest < 2 * 256 * 256 // 4
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        _chain(layers, x, alpha, factored=False)
    assert largest >= 2 * 256 * 256


def test_factored_path_rejects_pooled_attention():
    pooled = PoolingResidualAttention(8, 8, 2, pool_kernel=(3, 3), stride_kv=(2, 2))
    with pytest.raises(ValueError, match='without pooling and relative positions'):
        pooled(torch.randn(1, 4, 4, 8), ScoreFactors(), 0.5)
    with_rel_pos = PoolingResidualAttention(8, 8, 2, rel_pos_size=7)
    with pytest.raises(ValueError, match='carry the score tensors'):
        with_rel_pos(torch.randn(1, 4, 4, 8), ScoreFactors(), 0.5)


def _carried_kinds(model, x, backbone=None):
    """``model(x)`` and the type of what the last ReViT block carried (``backbone``: the ReViT inside model)."""
    kinds = []
    last = (backbone or model).blocks[-1].attn
    hook = last.register_forward_hook(lambda m, a, out: kinds.append(type(out[1])))
    try:
        out = model(x)
    finally:
        hook.remove()
    return out, kinds


@pytest.mark.parametrize('run', [None, 1, 3])
@pytest.mark.parametrize('with_cp', [False, True], ids=['eager', 'with_cp'])
def test_revit_carry_factors_gives_the_score_path(with_cp, run):
    torch.manual_seed(0)
    scored = ReViT(carry_factors=False, **TINY).to(F64)
    with torch.no_grad():
        for p in scored.parameters():
            p.add_(torch.randn_like(p) * 0.05)
        scored.alpha.fill_(0.3)
    factored = ReViT(carry_factors=True, factor_run=run, with_cp=with_cp, **TINY).to(F64)
    factored.load_state_dict(scored.state_dict())
    x = torch.randn(2, 3, 64, 80, dtype=F64)
    outs, grads = [], []
    for model, kind in ((scored, PooledScores), (factored, ScoreFactors)):
        model.train()
        out, kinds = _carried_kinds(model, x)
        assert kinds == [kind]
        sum((o * torch.linspace(-1, 1, o.shape[-1], dtype=F64)).square().mean() for o in out).backward()
        outs.append(out)
        grads.append({n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    for a, b in zip(*outs, strict=True):
        assert _rel(b, a) < 1e-12
    assert grads[0].keys() == grads[1].keys() and 'alpha' in grads[0]
    for key in grads[0]:
        torch.testing.assert_close(grads[1][key], grads[0][key], rtol=1e-9, atol=1e-12, msg=key)


def test_carry_factors_is_the_argument_alone():
    x = torch.randn(1, 3, 64, 64)
    for with_cp in (False, True):
        model = ReViT(carry_factors=True, with_cp=with_cp, **TINY).train()
        assert _carried_kinds(model, x)[1] == [ScoreFactors]
        with torch.no_grad():
            assert _carried_kinds(model.eval(), x)[1] == [ScoreFactors]  # inference runs the same path
        # the default carries the maps, also where with_cp checkpoints a training step
        assert _carried_kinds(ReViT(with_cp=with_cp, **TINY).train(), x)[1] == [PooledScores]
    with pytest.raises(ValueError, match='carry_factors must be True or False'):
        ReViT(carry_factors=None, **TINY)


def test_factor_run_must_be_positive():
    with pytest.raises(ValueError, match='factor_run must be a positive number of blocks'):
        ReViT(factor_run=0, **TINY)


@pytest.mark.parametrize('run', [None, 3])
def test_factored_revit_keeps_official_parity(run):
    meta = json.loads((CASE / 'meta.json').read_text())
    model = parity_model(meta, torch.load(CASE / 'state_dict.pth', weights_only=True)).double()
    assert isinstance(model.backbone, ReViT)
    model.backbone.carry_factors = True
    model.backbone.factor_run = run
    ref = torch.load(CASE / 'outputs.pt', weights_only=True)
    with torch.no_grad():
        full, kinds = _carried_kinds(model, torch.load(CASE / 'input.pt', weights_only=True).double(),
                                     backbone=model.backbone)
    assert kinds == [ScoreFactors]
    for ours, theirs in zip(full['stages'], ref['stages'], strict=True):
        assert _rel(ours, theirs) < 1e-6
    assert _rel(full['logits'], ref['logits']) < 1e-6
