"""mmvisatt.analysis: closed-form non-locality, captured probabilities equal the forward's, feature collapse,
PNG output, residual gates, and the command-line tools end to end on tiny models."""
import json
import math
import os
import subprocess
from pathlib import Path
from typing import List, Optional, Tuple

import pytest
import torch
from torch.overrides import TorchFunctionMode
import torch.nn as nn
from PIL import Image

from mmvisatt.analysis.cli import feature_collapse_main, model_summary_main, non_locality_main, run
from mmvisatt.analysis import (AttentionCapture, BlockOutputCapture, PooledAttentionRecord, UnsupportedModelError,
                               WindowAttentionRecord, attention_maps, feature_collapse, format_summary,
                               mean_pairwise_cosine, non_locality, plot_attention_map, plot_feature_collapse,
                               plot_non_locality, query_attention, record_non_locality, residual_gates)
from mmvisatt.models.backbones import ReMViTv2, ReSwinTransformer, ReViT
from mmvisatt.models.layers.pooling_attention import decomposed_rel_pos_terms
from mmvisatt.models.layers.residual_attention import PooledScores, TokenGrid, WindowScores
from mmvisatt.models.layers.window import (WindowGrid, merge_windows, partition_windows, window_attention_mask,
                                           window_token_coords)

REPO = Path(__file__).resolve().parents[1]
SWIN_TINY = dict(embed_dims=16, depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8))
MVIT_TINY = dict(embed_dims=16, depths=(1, 2, 1, 1), num_heads=1)
VIT_TINY = dict(embed_dims=32, depth=3, num_heads=2)


def _randomised(model: nn.Module, seed: int = 0) -> nn.Module:
    """Random weights everywhere (the default init leaves biases, rel-pos tables and norms trivial)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3 + (1.0 if p.dim() == 1 and p.numel() > 1 else 0.0))
        if isinstance(getattr(model, 'alpha', None), nn.Parameter):
            model.alpha.fill_(0.3)
    return model.double().eval()


# ---------------------------------------------------------------------------------------------------------
# Non-locality of hand-built attention equals its closed form
# ---------------------------------------------------------------------------------------------------------
def _pooled(probs: torch.Tensor, q: Tuple[int, int], kv: Tuple[int, int], q_stride: int,
            kv_stride: int) -> PooledAttentionRecord:
    return PooledAttentionRecord('layer', probs.double().log(), TokenGrid(*q), TokenGrid(*kv), (q_stride, q_stride),
                                 (kv_stride, kv_stride))


def test_non_locality_uniform_attention_on_a_grid():
    # every query of a 2x2 grid spreads evenly over the four tokens: distances 0, s, s, s*sqrt(2)
    s = 4
    record = _pooled(torch.full((1, 3, 4, 4), 0.25), (2, 2), (2, 2), s, s)
    expected = s * (2 + math.sqrt(2)) / 4
    assert torch.allclose(record_non_locality(record), torch.full((1, 3), expected, dtype=torch.float64))


def test_non_locality_one_hot_offset_is_that_distance():
    # queries of a 2x2 grid attend to the key 1 row down and 2 columns right on a 4x4 key grid of equal stride
    s = 8
    probs = torch.zeros(2, 1, 4, 16)
    for qy in range(2):
        for qx in range(2):
            probs[:, :, qy * 2 + qx, (qy + 1) * 4 + qx + 2] = 1
    record = _pooled(probs, (2, 2), (4, 4), s, s)
    assert torch.allclose(record_non_locality(record), torch.full((2, 1), s * math.sqrt(5), dtype=torch.float64))


def test_non_locality_uses_token_centres_across_grids():
    # a stride-16 key token covers the four stride-8 query tokens; its centre (8, 8) is 4*sqrt(2) from each of theirs
    record = _pooled(torch.ones(1, 2, 4, 1), (2, 2), (1, 1), 8, 16)
    assert torch.allclose(record_non_locality(record), torch.full((1, 2), 4 * math.sqrt(2), dtype=torch.float64))


def test_non_locality_window_attention_excludes_padding():
    # a 3x3 map in 2x2 windows pads to 4x4: windows hold 4, 2, 2 and 1 real tokens. Uniform attention over the
    # real keys of each window gives (2 + sqrt 2) s / 4 for the 4 queries of the full window, s / 2 for the 4 of
    # the half windows and 0 for the last: (4 + sqrt 2) s / 9 over the 9 real queries.
    s = 16
    grid = WindowGrid.build(3, 3, 2, 0)
    mask = window_attention_mask(grid).double()
    scores = torch.zeros(2 * grid.num_windows, 2, 4, 4, dtype=torch.float64)
    ys, xs = window_token_coords(grid)
    padded_queries = ((ys >= 3) | (xs >= 3)).repeat(2, 1)  # (B * num_windows, N)
    scores = torch.where(padded_queries[:, None, :, None], torch.randn_like(scores) * 5, scores)
    record = WindowAttentionRecord('layer', scores, mask, grid, (s, s))
    expected = (4 + math.sqrt(2)) * s / 9
    assert torch.allclose(record_non_locality(record), torch.full((2, 2), expected, dtype=torch.float64), atol=1e-9)


def test_non_locality_shifted_windows_use_image_positions():
    # a 4x4 map, 2x2 windows shifted by 1: the windows hold original rows/columns {1,2}x{1,2}, {1,2}x{3,0},
    # {3,0}x{1,2} and {3,0}x{3,0}. Uniform attention over each whole window (no mask) measures the real spans.
    s = 4
    grid = WindowGrid.build(4, 4, 2, 1)
    assert grid.shift == 1
    record = WindowAttentionRecord('layer', torch.zeros(grid.num_windows, 1, 4, 4, dtype=torch.float64), None,
                                   grid, (s, s))
    expected = s * (16 + 4 * math.sqrt(2) + 2 * math.sqrt(10)) / 16
    assert record_non_locality(record).item() == pytest.approx(expected, rel=1e-12)


def test_non_locality_of_uniform_vit_attention_end_to_end():
    # zero query/key projections make every score 0 (and so the carried residual): uniform attention over the
    # 2x2 tokens of a 32x32 image with 16-pixel patches, in every layer and head
    model = _randomised(ReViT(arch=VIT_TINY, img_size=32, patch_size=16))
    with torch.no_grad():
        for block in model.blocks:
            block.attn.qkv.weight[:2 * 32].zero_()
            block.attn.qkv.bias[:2 * 32].zero_()
    result = non_locality(model, torch.randn(3, 3, 32, 32, dtype=torch.float64), batch_size=2)
    assert [layer.name for layer in result.layers] == ['blocks.0', 'blocks.1', 'blocks.2']
    assert result.num_images == 3
    for layer in result.layers:
        assert layer.kind == 'pooled' and layer.stride == (16, 16)
        assert layer.heads == pytest.approx([16 * (2 + math.sqrt(2)) / 4] * 2, rel=1e-12)


# ---------------------------------------------------------------------------------------------------------
# Captured probabilities equal the ones of a hand-run explicit forward
# ---------------------------------------------------------------------------------------------------------
def _explicit_reswin(model: ReSwinTransformer, images: torch.Tensor) -> Tuple[torch.Tensor, List[torch.Tensor]]:
    """ReSwin's forward written out: window attention with residual scores, mask, softmax; returns the last
    stage's tokens and each layer's attention probabilities."""
    probs = []
    x = model.patch_embed(images)
    residual: Optional[WindowScores] = None
    for stage in model.stages:
        if stage.downsample is not None:
            x = stage.downsample(x)
        for block in stage.blocks:
            attn = block.attn
            B, H, W, C = x.shape
            grid = WindowGrid.build(H, W, block.window_size, block.shift)
            windows = partition_windows(block.norm1(x), grid)
            BW, N, _ = windows.shape
            q, k, v = attn.qkv(windows).reshape(BW, N, 3, attn.num_heads, -1).permute(2, 0, 3, 1, 4)
            scores = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5 + attn.relative_position_bias()
            if residual is not None:
                prev, valid = block.align(residual, grid, B, attn.num_heads)
                mixed = model.alpha * scores + (1 - model.alpha) * prev
                if valid is not None:
                    mixed = torch.where(valid.repeat(B, 1, 1)[:, None], mixed, scores)
                scores = mixed
            mask = window_attention_mask(grid)
            logits = scores if mask is None else scores + mask.to(scores).repeat(B, 1, 1)[:, None]
            p = logits.softmax(dim=-1)
            probs.append(p)
            out = attn.proj((p @ v).transpose(1, 2).reshape(BW, N, C))
            x = x + merge_windows(out, grid)
            x = x + block.mlp(block.norm2(x))
            residual = WindowScores(scores, grid)
    return x, probs


def _explicit_pooled_block(block: nn.Module, x: torch.Tensor, residual: Optional[PooledScores], alpha):
    """One ReViT/ReMViTv2 block written out; returns output, carried scores and attention probabilities."""
    attn = block.attn
    B, H, W, _ = x.shape
    x_norm = block.norm1(x)
    q, k, v = attn.qkv(x_norm).reshape(B, H * W, 3, attn.num_heads, -1).permute(2, 0, 3, 1, 4)

    def pool(t, conv, norm):
        if conv is None:
            return t, (H, W)
        dim = t.shape[-1]
        t = conv(t.reshape(B * attn.num_heads, H, W, dim).permute(0, 3, 1, 2))
        size = tuple(t.shape[-2:])
        return norm(t.reshape(B, attn.num_heads, dim, -1).transpose(2, 3)), size

    q, q_size = pool(q, attn.pool_q, attn.norm_q)
    k, kv_size = pool(k, attn.pool_k, attn.norm_k)
    v, _ = pool(v, attn.pool_v, attn.norm_v)
    base = (1, 1) if residual is None else (residual.q_grid.stride_h, residual.q_grid.stride_w)
    q_grid = TokenGrid(*q_size, base[0] * attn.stride_q[0], base[1] * attn.stride_q[1])
    kv_grid = TokenGrid(*kv_size, base[0] * attn.stride_kv[0], base[1] * attn.stride_kv[1])
    scores = q @ k.transpose(-2, -1) * attn.scale
    if residual is not None:
        scores = alpha * scores + (1 - alpha) * attn.align(residual, q_grid, kv_grid, attn.num_heads)
    if attn.rel_pos_h is not None:
        # MViTv2's decomposed relative positions, written out on the (qh, qw, kh, kw) grid
        rel_h, rel_w = decomposed_rel_pos_terms(q, q_size, kv_size, attn.rel_pos_h, attn.rel_pos_w)
        grid = scores.reshape(B, -1, *q_size, *kv_size)
        grid = grid + rel_h.reshape(B, -1, *q_size, kv_size[0], 1) + rel_w.reshape(B, -1, *q_size, 1, kv_size[1])
        scores = grid.reshape(scores.shape)
    p = scores.softmax(dim=-1)
    out = p @ v
    if attn.residual_pooling:
        out = out + q
    out = attn.proj(out.transpose(1, 2).reshape(B, *q_size, attn.dim_out))
    shortcut = x if block.shortcut_proj is None else block.shortcut_proj(x_norm)
    if block.shortcut_pool is not None:
        shortcut = block.shortcut_pool(shortcut.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
    x = shortcut + out
    return x + block.mlp(block.norm2(x)), PooledScores(scores, q_grid, kv_grid), p


def _explicit_remvit(model: ReMViTv2, images: torch.Tensor):
    probs, residual = [], None
    x = model.patch_embed(images)
    for stage in model.stages:
        for block in stage.blocks:
            x, residual, p = _explicit_pooled_block(block, x, residual, model.alpha)
            probs.append(p)
    return x, probs


def _explicit_revit(model: ReViT, images: torch.Tensor):
    probs, residual = [], None
    x = model.patch_embed(images)
    x = x + model._position_embedding(x.shape[1], x.shape[2])
    for block in model.blocks:
        x, residual, p = _explicit_pooled_block(block, x, residual, model.alpha)
        probs.append(p)
    return x, probs


def _captured(model: nn.Module, images: torch.Tensor):
    with AttentionCapture(model) as capture, torch.no_grad():
        outputs = model(images)
    return outputs, capture.records


@pytest.mark.parametrize('mode', ['aligned', 'official'])
def test_captured_window_probabilities_equal_the_forward(mode):
    # 72x60 pads every stage to whole windows and shifts stages 0-1, so masks for both shift and padding occur
    model = _randomised(ReSwinTransformer(arch=SWIN_TINY, residual_mode=mode))
    images = torch.randn(2, 3, 72, 60, dtype=torch.float64)
    outputs, records = _captured(model, images)
    with torch.no_grad():
        tokens, expected = _explicit_reswin(model, images)
    # the explicit run is the model's forward: same final tokens
    assert torch.allclose(model.norm3(tokens).permute(0, 3, 1, 2), outputs[-1], atol=1e-10)
    assert len(records) == len(expected) == 8
    assert any(r.mask is not None and r.grid.shift for r in records)
    assert any(r.mask is not None and r.grid.padded_h > r.grid.height for r in records)
    for record, p in zip(records, expected):
        assert isinstance(record, WindowAttentionRecord)
        assert torch.allclose(record.probabilities(), p, atol=1e-12), record.name
    assert [r.stride for r in records] == [(4, 4)] * 2 + [(8, 8)] * 2 + [(16, 16)] * 2 + [(32, 32)] * 2


def test_captured_window_probabilities_equal_what_the_softmax_returns():
    # independent of any re-implementation: the softmax of the model's own (reference) forward is recorded
    model = _randomised(ReSwinTransformer(arch=SWIN_TINY, fused_attn=False))
    seen = []

    class Softmaxes(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func in (torch.Tensor.softmax, torch.softmax):
                seen.append(out)
            return out

    with Softmaxes():
        _, records = _captured(model, torch.randn(1, 3, 52, 68, dtype=torch.float64))
    assert len(seen) == len(records)
    for record, p in zip(records, seen):
        assert torch.equal(record.probabilities(), p.flatten(0, 1)), record.name  # (B, windows) leading dims


def test_captured_pooled_probabilities_equal_the_forward():
    model = _randomised(ReMViTv2(arch=MVIT_TINY, img_size=64))
    images = torch.randn(2, 3, 64, 48, dtype=torch.float64)
    outputs, records = _captured(model, images)
    with torch.no_grad():
        tokens, expected = _explicit_remvit(model, images)
    assert torch.allclose(model.norm3(tokens).permute(0, 3, 1, 2), outputs[-1], atol=1e-10)
    assert len(records) == len(expected) == 5
    for record, p in zip(records, expected):
        assert isinstance(record, PooledAttentionRecord)
        assert torch.allclose(record.probabilities(), p, atol=1e-12), record.name
    # queries and keys on their own grids: block 0 has stride-4 queries and stride-16 keys
    assert records[0].q_stride == (4, 4) and records[0].kv_stride == (16, 16)
    assert [r.q_stride for r in records] == [(4, 4), (8, 8), (8, 8), (16, 16), (32, 32)]


def test_captured_global_probabilities_equal_the_forward():
    model = _randomised(ReViT(arch=VIT_TINY, img_size=64, patch_size=8))
    images = torch.randn(2, 3, 56, 72, dtype=torch.float64)
    _, records = _captured(model, images)
    with torch.no_grad():
        _, expected = _explicit_revit(model, images)
    assert len(records) == 3
    for record, p in zip(records, expected):
        assert torch.allclose(record.probabilities(), p, atol=1e-12), record.name
        assert record.q_grid.size == (7, 9) and record.q_stride == record.kv_stride == (8, 8)


def test_hooks_are_removed_and_model_unchanged():
    model = _randomised(ReSwinTransformer(arch=SWIN_TINY))
    images = torch.randn(1, 3, 32, 32, dtype=torch.float64)
    with torch.no_grad():
        before = model(images)
    with AttentionCapture(model), BlockOutputCapture(model), torch.no_grad():
        during = model(images)
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    assert all(torch.equal(a, b) for a, b in zip(before, during))


def test_model_without_supported_attention_is_rejected():
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU())
    with pytest.raises(UnsupportedModelError, match='ReSwinTransformer, ReViT and ReMViTv2'):
        non_locality(model, torch.randn(1, 3, 16, 16))
    with pytest.raises(UnsupportedModelError):
        feature_collapse(model, torch.randn(1, 3, 16, 16))


# ---------------------------------------------------------------------------------------------------------
# Attention maps
# ---------------------------------------------------------------------------------------------------------
def test_window_attention_map_is_the_query_window():
    model = _randomised(ReSwinTransformer(arch=SWIN_TINY))
    _, records = _captured(model, torch.randn(1, 3, 64, 64, dtype=torch.float64))
    record = records[1]  # shifted stage-0 block: 16x16 tokens of 4 px, windows of 7
    query = (30.0, 45.0)
    keys, stride = query_attention(record, query)
    assert stride == (4, 4) and keys.shape == (1, 16, 16)
    assert keys.sum().item() == pytest.approx(1.0, abs=1e-9)
    # the keys it can reach are the tokens that share its shifted window (up to the shift mask)
    ys, xs = window_token_coords(record.grid)
    qy, qx = int(query[0] // 4), int(query[1] // 4)
    window = next(w for w in range(record.grid.num_windows) if ((ys[w] == qy) & (xs[w] == qx)).any())
    inside = torch.zeros(16, 16, dtype=torch.bool)
    real = (ys[window] < 16) & (xs[window] < 16)
    inside[ys[window][real], xs[window][real]] = True
    assert keys[0][~inside].abs().max().item() < 1e-30
    maps = attention_maps(model, torch.randn(2, 3, 64, 64, dtype=torch.float64), layers=[1, 'stages.3.blocks.1'],
                          query=query)
    assert [(m.image_index, m.index) for m in maps] == [(0, 1), (0, 7), (1, 1), (1, 7)]
    for m in maps:
        # each key token is painted over its stride x stride pixels
        stride = 4 * 2 ** (m.index // 2)
        assert m.maps.shape[-2:] == (64, 64)
        assert m.maps.sum(dim=(-2, -1)) == pytest.approx([stride * stride] * m.maps.shape[0], rel=1e-9)


def test_pooled_attention_map_defaults_to_centre_and_stage_ends():
    model = _randomised(ReMViTv2(arch=MVIT_TINY, img_size=64))
    maps = attention_maps(model, torch.randn(1, 3, 64, 64, dtype=torch.float64))
    assert [m.index for m in maps] == [0, 2, 3, 4]  # first layer, last of each stride
    assert all(m.query == (32.0, 32.0) for m in maps)
    for m in maps:
        assert m.maps.shape == (m.maps.shape[0], 64, 64)
        assert (m.maps >= 0).all()
    with pytest.raises(ValueError, match='out of range'):
        attention_maps(model, torch.randn(1, 3, 64, 64, dtype=torch.float64), layers=[9])


# ---------------------------------------------------------------------------------------------------------
# Feature collapse
# ---------------------------------------------------------------------------------------------------------
def test_feature_collapse_closed_forms():
    identical = torch.randn(1, 1, 7).expand(2, 10, 7) * torch.rand(2, 10, 1)  # parallel, different lengths
    assert mean_pairwise_cosine(identical) == pytest.approx([1.0, 1.0], abs=1e-12)
    orthogonal = torch.eye(6)[None]
    assert mean_pairwise_cosine(orthogonal) == pytest.approx([0.0], abs=1e-12)
    opposite = torch.tensor([[[1.0, 0.0], [-1.0, 0.0]]])
    assert mean_pairwise_cosine(opposite) == pytest.approx([-1.0])
    tokens = torch.randn(3, 4, 5, 8)  # (B, H, W, C)
    unit = nn.functional.normalize(tokens.flatten(1, 2).double(), dim=-1)
    cos = unit @ unit.transpose(1, 2)
    brute = (cos.sum(dim=(1, 2)) - cos.diagonal(dim1=1, dim2=2).sum(-1)) / (20 * 19)
    assert torch.allclose(mean_pairwise_cosine(tokens), brute)


def test_feature_collapse_of_a_model():
    model = _randomised(ReSwinTransformer(arch=SWIN_TINY))
    images = torch.randn(3, 3, 64, 64, dtype=torch.float64)
    result = feature_collapse(model, images, batch_size=2)
    assert result.names == [f'stages.{s}.blocks.{b}' for s in range(4) for b in range(2)]
    assert result.num_tokens == [256, 256, 64, 64, 16, 16, 4, 4]
    with BlockOutputCapture(model) as capture, torch.no_grad():
        model(images)
    expected = [mean_pairwise_cosine(out).mean().item() for _, out in capture.outputs]
    assert result.similarity == pytest.approx(expected, rel=1e-9)


# ---------------------------------------------------------------------------------------------------------
# PNGs and gates
# ---------------------------------------------------------------------------------------------------------
def _assert_png(path: Path) -> Tuple[int, int]:
    with Image.open(path) as image:
        assert image.format == 'PNG'
        image.verify()
    with Image.open(path) as image:
        image.load()
        assert image.size[0] > 100 and image.size[1] > 100
        return image.size


def test_plots_write_valid_pngs(tmp_path):
    model = _randomised(ReSwinTransformer(arch=SWIN_TINY))
    images = torch.randn(2, 3, 64, 64, dtype=torch.float64)
    _assert_png(Path(plot_non_locality(non_locality(model, images), str(tmp_path / 'nl.png'))))
    _assert_png(Path(plot_feature_collapse(feature_collapse(model, images), str(tmp_path / 'sub' / 'fc.png'))))
    item = attention_maps(model, images[:1], layers=[-1])[0]
    pixels = (torch.rand(64, 64, 3) * 255).to(torch.uint8).numpy()
    _assert_png(Path(plot_attention_map(pixels, item, str(tmp_path / 'map.png'))))


def test_residual_gates_report_alpha():
    model = ReSwinTransformer(arch=SWIN_TINY)
    with torch.no_grad():
        model.alpha.fill_(0.37)
    gates = residual_gates(model)
    assert [(g.name, g.kind, g.learnable) for g in gates] == [('alpha', 'parameter', True)]
    assert gates[0].value == pytest.approx([0.37])
    text = format_summary(model)
    assert 'alpha = 0.37 (parameter, learnable)' in text
    assert 'stages.3' in text and f'{sum(p.numel() for p in model.parameters()):,}' in text

    official = residual_gates(ReSwinTransformer(arch=SWIN_TINY, residual_mode='official'))
    assert [(g.name, g.value, g.kind, g.learnable) for g in official] == [('alpha', [0.5], 'constant', False)]
    frozen = residual_gates(ReMViTv2(arch=MVIT_TINY, frozen_stages=1))
    assert [(g.kind, g.learnable) for g in frozen] == [('frozen parameter', False)]
    wrapped = residual_gates(nn.ModuleDict(dict(backbone=ReViT(arch=VIT_TINY, img_size=32))))
    assert [g.name for g in wrapped] == ['backbone.alpha']


# ---------------------------------------------------------------------------------------------------------
# Command-line tools, end to end
# ---------------------------------------------------------------------------------------------------------
@pytest.fixture(scope='module')
def tiny_setup(tmp_path_factory):
    """A config of a tiny ReSwin (its Pretrained init_cfg points nowhere: the tools must ignore it), an mm-style
    checkpoint of it with alpha = 0.3, and two generated demo images."""
    from mmvisatt.datasets import prepare_demo_coco
    root = tmp_path_factory.mktemp('analysis')
    config = root / 'reswin_tiny.py'
    config.write_text(
        'default_scope = "mmdet"\n'
        f'model = dict(backbone=dict(type="ReSwinTransformer", arch={SWIN_TINY!r}, '
        'init_cfg=dict(type="Pretrained", checkpoint="does/not/exist.pth")))\n')
    model = ReSwinTransformer(arch=SWIN_TINY)
    model.init_weights()
    with torch.no_grad():
        model.alpha.fill_(0.3)
    checkpoint = root / 'reswin_tiny.pth'
    torch.save({'state_dict': {'backbone.' + k: v for k, v in model.state_dict().items()}}, checkpoint)
    demo = prepare_demo_coco(root=str(root / 'demo'), num_train=1, num_val=2, img_size=64)
    return dict(config=str(config), checkpoint=str(checkpoint), images=str(Path(demo) / 'val'), root=root)


def _tool(python: str, name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([python, str(REPO / 'tools' / 'analysis' / f'{name}.py'), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300, env={**os.environ, 'OMP_NUM_THREADS': '1'})


def _ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_non_locality_tool(python, tiny_setup, tmp_path):
    s = tiny_setup
    out = _ok(_tool(python, 'non_locality', s['config'], s['checkpoint'], s['images'], '--out-dir', str(tmp_path),
                    '--size', '64'))
    data = json.loads((tmp_path / 'non_locality.json').read_text())
    assert data['num_images'] == 2 and data['image_size'] == [64, 64] and data['unit'] == 'pixels'
    assert [layer['name'] for layer in data['layers']] == [f'stages.{i}.blocks.{j}' for i in range(4)
                                                           for j in range(2)]
    assert [len(layer['heads']) for layer in data['layers']] == [1, 1, 2, 2, 4, 4, 8, 8]
    assert data['gates'][0]['value'] == pytest.approx([0.3])  # the checkpoint was loaded
    _assert_png(tmp_path / 'non_locality.png')
    assert 'stages.3.blocks.1' in out


def test_feature_collapse_tool(python, tiny_setup, tmp_path):
    s = tiny_setup
    _ok(_tool(python, 'feature_collapse', s['config'], s['checkpoint'], s['images'], '--out-dir', str(tmp_path),
              '--size', '48', '64'))
    data = json.loads((tmp_path / 'feature_collapse.json').read_text())
    assert data['image_size'] == [48, 64] and len(data['layers']) == 8
    assert all(-1.0 <= layer['similarity'] <= 1.0 for layer in data['layers'])
    _assert_png(tmp_path / 'feature_collapse.png')


def test_attention_maps_tool(python, tiny_setup, tmp_path):
    s = tiny_setup
    _ok(_tool(python, 'attention_maps', s['config'], s['checkpoint'], s['images'], '--out-dir', str(tmp_path),
              '--size', '64', '--layers', '0', '-1', '--query', '10', '50'))
    data = json.loads((tmp_path / 'attention_maps.json').read_text())
    assert [(Path(m['image']).name, m['layer']) for m in data['maps']] == [
        ('000000.png', 0), ('000000.png', 7), ('000001.png', 0), ('000001.png', 7)]
    for entry in data['maps']:
        assert entry['query'] == [10.0, 50.0]
        _assert_png(Path(entry['file']))


def test_model_summary_tool(python, tiny_setup, tmp_path):
    s = tiny_setup
    out = _ok(_tool(python, 'model_summary', s['config'], s['checkpoint'], '--json', str(tmp_path / 's.json')))
    assert 'alpha = 0.3 (parameter, learnable)' in out and 'stages.0' in out
    data = json.loads((tmp_path / 's.json').read_text())
    assert data['total_params'] == sum(row['params'] for row in data['stages'])


def test_tool_faces_in_process(tiny_setup, tmp_path, capsys):
    """Backbone specs, --backbone-options and the error exits, through the same ``main`` functions the scripts
    run (in-process: a subprocess per case would only add start-up time)."""
    s = tiny_setup
    run(model_summary_main, ['ReSwinTransformer:t', 'none', '--backbone-options', 'residual_mode=official'])
    out = capsys.readouterr().out
    assert 'alpha = 0.5 (constant)' in out and '27,520,698' in out
    run(non_locality_main, ['ReSwinTransformer:t', 'none', s['images'], '--out-dir', str(tmp_path), '--size', '32',
                            '--max-images', '1'])
    assert json.loads((tmp_path / 'non_locality.json').read_text())['layers'][-1]['stride'] == [32, 32]
    with pytest.raises(SystemExit, match='does not exist'):
        run(non_locality_main, [s['config'], 'none', str(tmp_path / 'nowhere'), '--out-dir', str(tmp_path)])
    with pytest.raises(SystemExit, match='does not fit'):
        run(model_summary_main, ['ReSwinTransformer:t', s['checkpoint']])
    with pytest.raises(SystemExit, match='no attention module the analysis can read'):
        run(feature_collapse_main, ['mmpretrain.ResNet', 'none', s['images'], '--out-dir', str(tmp_path),
                                    '--backbone-options', 'depth=18', '--size', '32'])


def test_factored_revit_is_rejected_with_the_fix():
    model = ReViT(arch=VIT_TINY, img_size=64, patch_size=8, score_memory='factors')
    with pytest.raises(UnsupportedModelError, match="score_memory='full'"), AttentionCapture(model), \
            torch.no_grad():
        model(torch.randn(1, 3, 64, 64))


def test_handed_on_scores_are_rejected_with_the_fix():
    model = ReMViTv2(arch=dict(embed_dims=16, depths=(1, 2, 1, 1), num_heads=1), score_memory='handoff')
    with pytest.raises(UnsupportedModelError, match="score_memory='full'"), AttentionCapture(model), \
            torch.no_grad():
        model(torch.randn(1, 3, 64, 64))
