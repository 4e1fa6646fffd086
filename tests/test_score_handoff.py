"""ReMViTv2's score handoff: a block whose scores the next block shrinks hands them on already shrunk.

The handoff path (``PoolingResidualAttention(..., handoff=True)`` with ``next_block`` set) must give the map
path's outputs and gradients, hand on exactly what the next block's alignment would have made of the full map,
and keep no score map of its own for the backward.
"""
import pytest
import torch

from mmvisatt.models.backbones import ReMViTv2
from mmvisatt.models.layers.pooling_attention import PoolingResidualAttention
from mmvisatt.models.layers.score_handoff import plan_handoff
from mmvisatt.models.layers.residual_attention import PooledScores, TokenGrid, align_pooled_by_position

F64 = torch.float64
ARCH = dict(embed_dims=16, depths=(1, 2, 2, 1), num_heads=1)


def _pair(**kwargs):
    torch.manual_seed(0)
    models = [ReMViTv2(arch=ARCH, drop_path_rate=0., handoff=h, **kwargs).to(F64) for h in (True, False)]
    with torch.no_grad():
        for p in models[0].parameters():
            p.add_(torch.randn_like(p) * 0.05)  # away from the zero-initialised position tables
    models[1].load_state_dict(models[0].state_dict())
    return models


def _run(model, x):
    model.train()
    outs = model(x)
    weights = [torch.linspace(-1, 1, o.numel(), dtype=F64).view_as(o) for o in outs]
    sum((o * w).sum() for o, w in zip(outs, weights)).backward()
    return [o.detach() for o in outs], {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize('with_cp', [False, True], ids=['plain', 'with_cp'])
@pytest.mark.parametrize('chunking', ['default', 'many_chunks'], indirect=True)
def test_handoff_equals_the_map_path(with_cp, chunking):
    handed, mapped = _pair(with_cp=with_cp)
    # odd, non-square: ragged pooling windows at the bottom and right borders, keys repeated onto finer grids
    x = torch.randn(2, 3, 70, 90, dtype=F64)
    outs_h, grads_h = _run(handed, x)
    outs_m, grads_m = _run(mapped, x)
    for a, b in zip(outs_h, outs_m):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert grads_h.keys() == grads_m.keys() and 'alpha' in grads_h
    for name in grads_m:
        # norm_k.bias shifts every key of a row alike, which the softmax ignores: its gradient is rounding (1e-15)
        torch.testing.assert_close(grads_h[name], grads_m[name], rtol=1e-9, atol=1e-12, msg=name)


def _carried(model, x):
    """What every block carried on (made_on is set where the scores were handed on reduced)."""
    seen = []
    hooks = [block.attn.register_forward_hook(lambda m, a, out: seen.append(out[1].made_on is not None))
             for stage in model.stages for block in stage.blocks]
    try:
        model(x).__len__()
    finally:
        for hook in hooks:
            hook.remove()
    return seen


def test_handoff_is_the_argument_alone():
    x = torch.randn(1, 3, 64, 64)
    handed = _carried(ReMViTv2(arch=ARCH, handoff=True).train(), x.clone().requires_grad_())
    # stage 1 -> 2 pools queries, stage 2's first block pools keys for its second, 2 -> 3 averages heads ...
    assert any(handed) and not all(handed)
    # the same blocks hand off with checkpointing, without gradients and in eval mode: one path per setting
    assert _carried(ReMViTv2(arch=ARCH, handoff=True, with_cp=True).train(), x.clone().requires_grad_()) == handed
    with torch.no_grad():
        assert _carried(ReMViTv2(arch=ARCH, handoff=True).eval(), x) == handed
    # the default keeps the maps, also in training with gradients and with_cp
    assert not any(_carried(ReMViTv2(arch=ARCH).train(), x.clone().requires_grad_()))
    assert not any(_carried(ReMViTv2(arch=ARCH, with_cp=True).train(), x.clone().requires_grad_()))
    # the official alignment sees token counts only; it keeps the map path
    official = ReMViTv2(arch=ARCH, handoff=True, residual_mode='official').eval()
    assert not any(_carried(official, torch.randn(1, 3, 64, 64)))
    with pytest.raises(ValueError, match='handoff must be True or False'):
        ReMViTv2(arch=ARCH, handoff='yes')
    with pytest.raises(ValueError, match='handoff must be True or False'):
        ReMViTv2(arch=ARCH, handoff=None)


def _attention_pair(next_block):
    torch.manual_seed(0)
    layer = PoolingResidualAttention(8, 16, 2, pool_kernel=(3, 3), stride_q=(2, 2), stride_kv=(1, 1),
                                     rel_pos_size=23, residual_pooling=True).to(F64)
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    layer.next_block = next_block
    return layer


@pytest.mark.parametrize('next_block', [((1, 1), (2, 2), 2), ((2, 2), (1, 1), 4), ((2, 1), (1, 2), 2)],
                         ids=['keys_pooled', 'queries_pooled_heads_averaged', 'mixed_axes'])
def test_handed_scores_are_what_the_next_block_aligns(next_block):
    layer = _attention_pair(next_block)
    x = torch.randn(2, 12, 11, 8, dtype=F64)
    prev = PooledScores(torch.randn(2, 1, 132, 132, dtype=F64), TokenGrid(12, 11), TokenGrid(12, 11))
    with torch.no_grad():
        out_h, handed = layer(x, prev, 0.4, handoff=True)
        out_m, full = layer(x, prev, 0.4, handoff=False)
    torch.testing.assert_close(out_h, out_m, rtol=1e-12, atol=1e-12)
    assert handed.made_on == full.q_grid and full.made_on is None
    assert handed.scores.numel() < full.scores.numel()
    # the next block's grids, as it builds them from its input (this block's query grid)
    (sq_h, sq_w), (skv_h, skv_w), heads = next_block
    grid = full.q_grid
    q_next = TokenGrid(-(-grid.height // sq_h), -(-grid.width // sq_w), grid.stride_h * sq_h, grid.stride_w * sq_w)
    kv_next = TokenGrid(-(-grid.height // skv_h), -(-grid.width // skv_w), grid.stride_h * skv_h,
                        grid.stride_w * skv_w)
    torch.testing.assert_close(align_pooled_by_position(handed, q_next, kv_next, heads),
                               align_pooled_by_position(full, q_next, kv_next, heads), rtol=1e-12, atol=1e-12)


def test_nothing_to_shed_keeps_the_map_path():
    grid = TokenGrid(6, 6, 2, 2)
    assert plan_handoff(grid, grid, 2, ((1, 1), (1, 1), 2)) is None
    assert plan_handoff(grid, grid, 2, ((1, 1), (1, 1), 4)).mean_heads
    assert plan_handoff(grid, TokenGrid(3, 3, 4, 4), 1, ((1, 1), (1, 1), 2)) is None  # keys get finer: repeat only


def test_no_score_map_is_saved_for_the_backward():
    layer = _attention_pair(((1, 1), (2, 2), 2))
    x = torch.randn(1, 16, 16, 8, dtype=F64, requires_grad=True)
    prev = PooledScores(torch.randn(1, 1, 256, 256, dtype=F64, requires_grad=True), TokenGrid(16, 16),
                        TokenGrid(16, 16))
    full = 2 * 64 * 256  # heads x this block's queries x keys

    def largest_saved(handoff):
        largest = 0

        def pack(t):
            nonlocal largest
            # the previous block's scores are alive anyway (they are its output)
            if t.dim() == 4 and t.data_ptr() != prev.scores.data_ptr():
                largest = max(largest, t.numel())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out, carried = layer(x, prev, 0.4, handoff=handoff)
        (out.sum() + carried.scores.sum()).backward()
        return largest

    assert largest_saved(False) >= full
    # what is left: the incoming residual (1 x 64 x 256 after query pooling), q, k, v
    assert largest_saved(True) < full


def test_handoff_under_bfloat16_autocast():
    handed, mapped = (m.float() for m in _pair())
    x = torch.randn(1, 3, 64, 80)
    results = []
    for model in (handed, mapped):
        model.train()
        with torch.autocast('cpu', dtype=torch.bfloat16):
            outs = model(x)
        sum(o.float().square().mean() for o in outs).backward()
        results.append(([o.float().detach() for o in outs], model.alpha.grad.clone()))
    for a, b in zip(results[0][0], results[1][0]):
        torch.testing.assert_close(a, b, rtol=0.05, atol=0.05)
    assert torch.isfinite(results[0][1]).all()
    torch.testing.assert_close(results[0][1], results[1][1], rtol=0.1, atol=0.05)


def test_handoff_runs_on_the_meta_device():
    # a FLOP count runs the configs' model (handoff=True) on meta tensors, which have no autocast state
    from mmvisatt.analysis.model_zoo import count_multiply_adds
    model = ReMViTv2(arch=ARCH, handoff=True).eval()
    with torch.device('meta'):
        meta_model = ReMViTv2(arch=ARCH, handoff=True).eval()
    x = torch.empty(1, 3, 64, 64, device='meta')
    with torch.no_grad():
        outs = meta_model(x)
    assert [o.shape for o in outs] == [o.shape for o in model(torch.zeros(1, 3, 64, 64))]
    assert count_multiply_adds(lambda: meta_model(x)) > 0
