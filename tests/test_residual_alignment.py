"""The position alignment of residual scores: every carried score belongs to the same pair of positions."""
import torch

from mmvisatt.models.layers.residual_attention import WindowScores, align_by_position, align_by_slot
from mmvisatt.models.layers.window import WindowGrid, window_token_coords


def _pair_code_scores(grid: WindowGrid, heads: int = 1) -> torch.Tensor:
    """Scores whose value encodes the (query, key) positions: (nW, heads, N, N)."""
    ys, xs = window_token_coords(grid)
    code = (ys * 1000 + xs).double()
    scores = code[:, :, None] * 1e6 + code[:, None, :]
    return scores[:, None].expand(-1, heads, -1, -1).clone()


def test_shift_alignment_carries_same_position_pairs():
    prev = WindowGrid.build(14, 21, 7, 0)
    cur = WindowGrid.build(14, 21, 7, 3)
    aligned, valid = align_by_position(WindowScores(_pair_code_scores(prev, 2), prev), cur, 1, 2)
    expected = _pair_code_scores(cur, 2)
    v = valid[:, None].expand_as(aligned)
    assert torch.equal(aligned[v], expected[v])
    # window 0 of the shifted partition sees positions 3..9: pairs within 3..6 or within 7..9 existed before
    assert valid.any() and not valid.all()
    assert valid.float().mean() > 0.25


def test_same_partition_is_identity():
    grid = WindowGrid.build(14, 14, 7, 3)
    scores = torch.randn(2 * grid.num_windows, 3, 49, 49)
    aligned, valid = align_by_position(WindowScores(scores, grid), grid, 2, 3)
    assert valid[:, :4 * 7, :4 * 7].all()
    assert torch.equal(aligned[:, :, valid.all(0)], scores[:, :, valid.all(0)])


def test_patch_merging_averages_children_and_heads():
    fine = WindowGrid.build(14, 14, 7, 0)
    coarse = WindowGrid.build(7, 7, 7, 0)
    prev = torch.zeros(fine.num_windows, 2, 49, 49)
    prev[:, 0] = 1.0
    prev[:, 1] = 3.0  # head mean = 2
    aligned, valid = align_by_position(WindowScores(prev, fine), coarse, 1, 4)
    assert aligned.shape == (1, 1, 49, 49)
    # coarse token 3 covers fine 6 (window 0) and 7 (window 1): the pair (0,0)-(3,3) keeps its children
    # that shared fine window 0
    assert valid[0, 0, 3 * 7 + 3]
    assert torch.allclose(aligned[0, 0][valid[0]], torch.full_like(aligned[0, 0][valid[0]], 2.0))
    # a coarse pair whose children never shared a fine window gets no residual
    assert not valid[0, 0, 6]  # (0,0) vs (0,6): fine columns 0..1 vs 12..13 are in different fine windows


def test_official_alignment_is_slot_nearest():
    prev_grid = WindowGrid.build(14, 14, 7, 0)
    cur_grid = WindowGrid.build(7, 7, 7, 0)
    prev = torch.arange(4 * 3, dtype=torch.float64).view(4, 3, 1, 1).expand(4, 3, 49, 49)
    aligned, valid = align_by_slot(WindowScores(prev, prev_grid), cur_grid, 1, 6)
    assert valid is None
    # 12 (window, head) slots resized to 6: slot j takes old slot 2j
    assert aligned[0, :, 0, 0].tolist() == [0., 2., 4., 6., 8., 10.]
