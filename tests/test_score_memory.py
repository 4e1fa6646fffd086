"""The score-memory strategies of ReViT and ReMViTv2 (``score_memory``, :mod:`mmvisatt.models.layers.score_memory`).

Each strategy must be the reference (``'full'``, plain autograd over ``residual_attention``) in every value: outputs
and carried scores to float64 rounding, every gradient including alpha's; ``'handoff'`` must hand on exactly what
the next block's alignment would make of the full map; neither chunked strategy may keep a score map of its own
for the backward.
"""
import copy
import json
from pathlib import Path

import pytest
import torch

from mmvisatt.models.backbones import ReMViTv2, ReViT
from mmvisatt.models.layers.pooling_attention import PoolingResidualAttention
from mmvisatt.models.layers.residual_attention import (PooledScores, ScoreFactors, TokenGrid,
                                                       align_pooled_by_position)
from mmvisatt.models.layers.score_memory import ScoreReduction, set_score_chunk_numel
from mmvisatt.testing import parity_model

F64 = torch.float64
PARITY = Path(__file__).parent / 'data/parity/revit/revit_a'

# (module kwargs, previous scores (heads, q grid, kv grid) or None)
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
# what the next block may be: nothing to shrink, keys pooled, queries pooled with heads averaged
NEXT_BLOCKS = {'last_block': None, 'keys_pooled': ((1, 1), (2, 2), 2), 'queries_pooled': ((2, 2), (1, 1), 4)}


def _pair(case: str, next_block=None, dtype=F64):
    kwargs, _ = CASES[case]
    torch.manual_seed(0)
    full = PoolingResidualAttention(8, 16, residual_pooling=True, **kwargs).to(dtype)
    with torch.no_grad():
        for p in full.parameters():
            p.normal_(0, 0.3)
    chunked = PoolingResidualAttention(8, 16, residual_pooling=True, score_memory='handoff', next_block=next_block,
                                       **kwargs).to(dtype)
    chunked.load_state_dict(full.state_dict())
    return full, chunked


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


def _run(module, x, residual, alpha, next_grids=None):
    """Output, carried scores (on the next block's grids when given) and the gradients of a loss of both."""
    out, carried = module(x, residual, alpha)
    scores = carried.scores if next_grids is None else align_pooled_by_position(carried, *next_grids)
    # weigh the carried scores so their gradient path (into the next layer) is tested as well
    weights = torch.linspace(-1, 1, scores.shape[-1], dtype=scores.dtype)
    loss = out.square().sum() + (scores * weights).sum()
    wrt = [*module.parameters(), x] + ([residual.scores] if residual is not None else [])
    wrt += [alpha] if torch.is_tensor(alpha) else []
    return out, scores, torch.autograd.grad(loss, wrt, allow_unused=True)


def _next_grids(module, x, residual, next_block):
    """The grids and heads the next block aligns to, from this block's query grid."""
    if next_block is None:
        return None
    with torch.no_grad():
        grid = module(x, residual, 0.3)[1].q_grid
    (sq_h, sq_w), (skv_h, skv_w), heads = next_block
    pooled = lambda sh, sw: TokenGrid(-(-grid.height // sh), -(-grid.width // sw), grid.stride_h * sh,  # noqa: E731
                                      grid.stride_w * sw)
    return pooled(sq_h, sq_w), pooled(skv_h, skv_w), heads


@pytest.mark.parametrize('next_block', sorted(NEXT_BLOCKS))
@pytest.mark.parametrize('alpha_kind', ['param', 'float'])
@pytest.mark.parametrize('case', sorted(CASES))
def test_row_chunks_are_the_reference(case, alpha_kind, next_block, chunking):
    if case == 'plain_vit' and next_block == 'queries_pooled':
        pytest.skip('a plain ViT block has no pooled successor')
    full, chunked = _pair(case, NEXT_BLOCKS[next_block])
    x, residual, alpha = _inputs(case, alpha_kind)
    grids = _next_grids(full, x, residual, NEXT_BLOCKS[next_block])
    out_a, scores_a, grads_a = _run(full, x, residual, alpha, grids)
    out_b, scores_b, grads_b = _run(chunked, x, residual, alpha, grids)
    torch.testing.assert_close(out_b, out_a, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(scores_b, scores_a, rtol=1e-12, atol=1e-12)
    for a, b in zip(grads_a, grads_b, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-12)


def test_reductions_shrink_only_what_the_next_block_shrinks():
    grid = TokenGrid(6, 6, 2, 2)
    assert not ScoreReduction.plan(grid, grid, 2, ((1, 1), (1, 1), 2)).shrinks
    assert ScoreReduction.plan(grid, grid, 2, ((1, 1), (1, 1), 4)).mean_heads
    assert not ScoreReduction.plan(grid, TokenGrid(3, 3, 4, 4), 1, ((1, 1), (1, 1), 2)).shrinks  # keys get finer
    assert not ScoreReduction.plan(grid, grid, 2, None).shrinks
    reduction = ScoreReduction.plan(TokenGrid(12, 11), TokenGrid(12, 11), 2, ((2, 2), (1, 1), 4))
    assert reduction.mean_heads and reduction.q_pool == (2, 2) and reduction.q_grid == TokenGrid(6, 6, 2, 2)


def _largest_saved(module, x, residual, alpha) -> int:
    """The largest tensor saved for the backward, besides the previous scores (the previous block's output,
    alive anyway)."""
    largest = 0
    alive = getattr(residual, 'scores', None)

    def pack(t):
        nonlocal largest
        if alive is None or t.untyped_storage().data_ptr() != alive.untyped_storage().data_ptr():
            largest = max(largest, t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(x, residual, alpha)
    return largest


def test_chunked_strategies_save_no_score_map():
    # a map large against the channels, as at detection sizes, so only score maps pass the size filter
    torch.manual_seed(0)
    kwargs = dict(pool_kernel=(3, 3), stride_q=(1, 1), stride_kv=(2, 2), rel_pos_size=31, residual_pooling=True)
    full = PoolingResidualAttention(8, 16, 2, **kwargs).to(F64)
    handoff = PoolingResidualAttention(8, 16, 2, score_memory='handoff', next_block=((1, 1), (2, 2), 2),
                                       **kwargs).to(F64)
    x = torch.randn(1, 32, 32, 8, dtype=F64, requires_grad=True)
    prev = torch.randn(1, 1, 32 * 32, 16 * 16, dtype=F64, requires_grad=True)
    residual = PooledScores(prev, TokenGrid(32, 32, 1, 1), TokenGrid(16, 16, 2, 2))
    alpha = torch.tensor([0.3], dtype=F64, requires_grad=True)
    one_map = 2 * 32 * 32 * 16 * 16
    assert _largest_saved(full, x, residual, alpha) >= one_map
    assert _largest_saved(handoff, x, residual, alpha) < one_map // 2

    factored = [PoolingResidualAttention(8, 8, 2, score_memory='factors').to(F64) for _ in range(3)]
    x = torch.randn(1, 16, 16, 8, dtype=F64, requires_grad=True)  # 256 tokens: a map is 2 x 256 x 256
    carried, largest = ScoreFactors(), 0
    for layer in factored:
        largest = max(largest, _largest_saved(layer, x, carried, alpha))
        carried = layer(x, carried, alpha)[1]
    # the widest saved tensors are the concatenated factors of the last layer: 2 heads x 256 tokens x 3 x 4
    assert 0 < largest < 2 * 256 * 256 // 4


BACKBONES = {
    'ReMViTv2': (ReMViTv2, dict(arch=dict(embed_dims=16, depths=(1, 2, 2, 1), num_heads=1)), 'handoff'),
    'ReMViTv2-constant-alpha': (ReMViTv2, dict(arch=dict(embed_dims=16, depths=(1, 2, 1, 1), num_heads=1),
                                               learnable_alpha=False), 'handoff'),
    'ReViT-fold-never': (ReViT, dict(arch=dict(embed_dims=32, depth=4, num_heads=4), fold_every=None), 'factors'),
    'ReViT-fold-every': (ReViT, dict(arch=dict(embed_dims=32, depth=4, num_heads=4), fold_every=1), 'factors'),
    'ReViT-fold-3': (ReViT, dict(arch=dict(embed_dims=32, depth=4, num_heads=4)), 'factors'),
}


def _backbones(name, **kwargs):
    cls, arch, strategy = BACKBONES[name]
    torch.manual_seed(0)
    full = cls(drop_path_rate=0., img_size=64, **arch).to(F64)
    with torch.no_grad():
        for p in full.parameters():
            p.add_(torch.randn_like(p) * 0.05)  # away from the zero-initialised position tables
    other = cls(drop_path_rate=0., img_size=64, score_memory=strategy, **arch, **kwargs).to(F64)
    other.load_state_dict(full.state_dict())
    return full, other


@pytest.mark.parametrize('with_cp', [False, True], ids=['eager', 'with_cp'])
@pytest.mark.parametrize('name', sorted(BACKBONES))
def test_backbone_strategies_are_the_reference(name, with_cp, chunking):
    if chunking == 'many_chunks' and with_cp:
        pytest.skip('the chunks are tested eagerly; with_cp only re-runs the same blocks')
    models = _backbones(name, with_cp=with_cp)
    # odd, non-square: ragged pooling windows at the bottom and right borders, keys repeated onto finer grids
    x = torch.randn(2, 3, 70, 90, dtype=F64)
    outs, grads = [], []
    for model in models:
        model.train()
        out = model(x)
        sum((o * torch.linspace(-1, 1, o.shape[-1], dtype=F64)).square().mean() for o in out).backward()
        outs.append(out)
        grads.append({n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    for a, b in zip(*outs, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-12)
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for key in grads[0]:
        # norm_k.bias shifts every key of a row alike, which the softmax ignores: its gradient is rounding (1e-15)
        torch.testing.assert_close(grads[1][key], grads[0][key], rtol=1e-9, atol=1e-12, msg=key)


def _carried(model, x):
    """What every attention carried on: 'shrunk', 'map' or 'factors'."""
    seen = []

    def hook(module, args, out):
        carried = out[1]
        kind = 'factors' if isinstance(carried, ScoreFactors) else 'map'
        seen.append('shrunk' if kind == 'map' and carried.source_q_grid is not None else kind)

    hooks = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, PoolingResidualAttention)]
    try:
        model(x)
    finally:
        for h in hooks:
            h.remove()
    return seen


def test_the_strategy_is_the_argument_alone():
    x = torch.randn(1, 3, 64, 64)
    arch = BACKBONES['ReMViTv2'][1]
    handed = _carried(ReMViTv2(score_memory='handoff', **arch).train(), x.clone().requires_grad_())
    # stage 1 -> 2 pools queries, stage 2's first block pools keys for its second, 2 -> 3 averages heads ...
    assert 'shrunk' in handed and 'map' in handed
    # the same blocks hand off with checkpointing and in inference: one path per setting
    with_cp = ReMViTv2(score_memory='handoff', with_cp=True, **arch).train()
    assert _carried(with_cp, x.clone().requires_grad_()) == handed
    with torch.no_grad():
        assert _carried(ReMViTv2(score_memory='handoff', **arch).eval(), x) == handed
        assert set(_carried(ReMViTv2(**arch).eval(), x)) == {'map'}
        revit = BACKBONES['ReViT-fold-never'][1]
        assert set(_carried(ReViT(score_memory='factors', **revit).eval(), x)) == {'factors'}
        assert set(_carried(ReViT(**revit).eval(), x)) == {'map'}


def test_strategies_that_cannot_apply_are_refused():
    arch = BACKBONES['ReMViTv2'][1]
    with pytest.raises(ValueError, match=r"ReMViTv2 takes score_memory in \('full', 'handoff'\), got 'factors'"):
        ReMViTv2(score_memory='factors', **arch)
    with pytest.raises(ValueError, match="ReViT takes score_memory in"):
        ReViT(score_memory='handoff', arch=dict(embed_dims=32, depth=2, num_heads=4))
    with pytest.raises(ValueError, match='needs attention without pooling and relative positions'):
        PoolingResidualAttention(8, 8, 2, pool_kernel=(3, 3), stride_kv=(2, 2), score_memory='factors')
    with pytest.raises(ValueError, match='fold_every must be a positive number of blocks'):
        ReViT(fold_every=0, arch=dict(embed_dims=32, depth=2, num_heads=4))
    with pytest.raises(ValueError, match='positive number of elements'):
        set_score_chunk_numel(0)


@pytest.mark.parametrize('name', ['ReMViTv2', 'ReViT-fold-3'])
def test_strategies_under_bfloat16_autocast(name):
    models = [m.float() for m in _backbones(name)]
    x = torch.randn(1, 3, 64, 80)
    results = []
    for model in models:
        model.train()
        with torch.autocast('cpu', dtype=torch.bfloat16):
            outs = model(x)
        sum(o.float().square().mean() for o in outs).backward()
        results.append(([o.float().detach() for o in outs], model.alpha.grad.clone()))
    for a, b in zip(results[0][0], results[1][0]):
        torch.testing.assert_close(b, a, rtol=0.05, atol=0.05)
    assert torch.isfinite(results[1][1]).all()
    torch.testing.assert_close(results[1][1], results[0][1], rtol=0.1, atol=0.05)


@pytest.mark.parametrize('name', ['ReMViTv2', 'ReViT-fold-3'])
def test_strategies_run_on_the_meta_device(name):
    # a FLOP count runs the configs' model on meta tensors, which have no autocast state
    from mmvisatt.analysis.model_zoo import count_multiply_adds
    cls, arch, strategy = BACKBONES[name]
    model = cls(score_memory=strategy, img_size=64, **arch).eval()
    with torch.device('meta'):
        meta_model = cls(score_memory=strategy, img_size=64, **arch).eval()
    x = torch.empty(1, 3, 64, 64, device='meta')
    with torch.no_grad():
        outs = meta_model(x)
    assert [o.shape for o in outs] == [o.shape for o in model(torch.zeros(1, 3, 64, 64))]
    assert count_multiply_adds(lambda: meta_model(x)) > 0


@pytest.mark.parametrize('fold_every', [None, 3])
def test_factored_revit_keeps_official_parity(fold_every):
    meta = json.loads((PARITY / 'meta.json').read_text())
    model = parity_model(meta, torch.load(PARITY / 'state_dict.pth', weights_only=True)).double()
    factored = copy.deepcopy(model.backbone)
    for block in factored.blocks:
        block.attn.score_memory = 'factors'
    factored.score_memory, factored.fold_every = 'factors', fold_every
    model.backbone = factored
    ref = torch.load(PARITY / 'outputs.pt', weights_only=True)
    with torch.no_grad():
        full = model(torch.load(PARITY / 'input.pt', weights_only=True).double())
    assert set(_carried(factored, torch.zeros(1, 3, 32, 32, dtype=F64))) == {'factors'}
    rel = lambda a, b: ((a - b).abs().max() / b.abs().max()).item()  # noqa: E731
    for ours, theirs in zip(full['stages'], ref['stages'], strict=True):
        assert rel(ours, theirs) < 1e-6
    assert rel(full['logits'], ref['logits']) < 1e-6
