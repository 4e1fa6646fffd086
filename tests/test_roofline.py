"""The cost model of a training step (tools/analysis/roofline.py): what each kernel costs, what costs nothing,
autocast's dtypes, and a whole backbone step on the meta device."""
import pytest
import torch

import roofline  # noqa: E402  (tools/analysis, on sys.path through conftest)


def test_a_matrix_product_costs_its_flops_or_its_bytes_at_autocasts_dtypes():
    x = torch.empty(4096, 1024, device='meta')
    w = torch.empty(1024, 1024, device='meta')
    model = roofline.CostModel([w])
    with model:
        y = x @ w  # float32 operands: autocast casts both to bf16, the weight once
        z = x @ w
        y.t().unsqueeze(0)[:, 1:].expand(3, -1, -1)  # views launch nothing
    cast_x, cast_w, mm, cast_x2, mm2 = model.kernels
    assert (cast_x['op'], cast_w['op'], mm['op']) == ('autocast cast to bf16', 'autocast cast to bf16', 'mm')
    assert cast_x['bytes'] == 4096 * 1024 * (4 + 2) and cast_w['bytes'] == 1024 * 1024 * 6
    assert mm['flops'] == 2 * 4096 * 1024 * 1024
    assert mm['bytes'] == 2 * (4096 * 1024 + 1024 * 1024 + 4096 * 1024)  # reads and writes bf16
    assert mm['seconds'] == pytest.approx(max(mm['flops'] / roofline.PEAK_FLOPS, mm['bytes'] / roofline.BANDWIDTH)
                                          + roofline.LAUNCH)
    assert cast_x2['op'] == 'autocast cast to bf16' and mm2['op'] == 'mm'  # the weight's copy is kept
    assert z.shape == y.shape


def test_float32_ops_write_float32_and_the_rest_the_wider_input():
    x = torch.empty(64, 128, device='meta')
    w = torch.empty(128, 128, device='meta')
    model = roofline.CostModel([w])
    with model:
        h = x @ w  # bf16 under autocast
        g = torch.nn.functional.gelu(h)  # stays bf16
        s = torch.softmax(g, -1)  # float32
    gelu, softmax = model.kernels[-2:]
    assert gelu['op'] == 'gelu' and gelu['bytes'] == 2 * 64 * 128 * 2 and gelu['flops'] == 0
    assert softmax['op'] == '_softmax' and softmax['bytes'] == 64 * 128 * (2 + 4)
    assert gelu['memory_bound'] and s.shape == (64, 128)


def test_a_backbone_step_has_a_cost_with_its_anchor():
    """ReSwin-T computes timm's Swin-T's FLOPs (the same architecture with ReViT's residual added) and, on its fused
    path, the windows' q k^T once more: in the attention kernel and for the carried map (2% of the step at 224)."""
    ours = roofline.step_cost('reswin_t', (224, 224), 1)
    swin = roofline.step_cost('timm.swin_tiny_patch4_window7_224', (224, 224), 1)
    assert swin['tflops'] > 0 and 1.0 < ours['tflops'] / swin['tflops'] < 1.03
    for row in (ours, swin):
        assert row['seconds'] == pytest.approx(sum(t['seconds'] for t in row['top']))
        assert row['achieved_tflops_per_s'] == pytest.approx(row['tflops'] / row['seconds'])
        assert 0 < row['memory_bound_share'] <= 1 and row['kernels'] > 100
    table = roofline.markdown_table([ours, swin])
    assert '| reswin_t |' in table and '| timm.swin_tiny_patch4_window7_224 |' in table


def test_attention_takes_the_gpus_fused_kernels_on_the_meta_device():
    q = torch.empty(2, 3, 49, 32, device='meta', requires_grad=True)
    model = roofline.CostModel()
    with model, roofline.gpu_attention_kernels():
        out = torch.nn.functional.scaled_dot_product_attention(q, q, q)
        out.sum().backward()
    ops = [k['op'] for k in model.kernels]
    assert '_scaled_dot_product_flash_attention' in ops and '_scaled_dot_product_flash_attention_backward' in ops
    assert 'bmm' not in ops and '_softmax' not in ops


@pytest.mark.parametrize('groups', [1, 64])
def test_a_convolutions_backward_costs_twice_its_forward(groups):
    """Input and weight gradients each cost the forward's FLOPs, for a depthwise convolution too."""
    x = torch.empty(2, 64, 32, 32, device='meta', requires_grad=True)
    w = torch.empty(64, 64 // groups, 3, 3, device='meta', requires_grad=True)
    model = roofline.CostModel([w])
    with model:
        torch.nn.functional.conv2d(x, w, padding=1, groups=groups).sum().backward()
    forward, = [k['flops'] for k in model.kernels if k['op'] == 'convolution']
    backward, = [k['flops'] for k in model.kernels if k['op'] == 'convolution_backward']
    assert forward == 2 * 2 * 64 * 32 * 32 * (64 // groups) * 9 and backward == 2 * forward
