"""The FlexAttention candidate for RMT's / EVT's full-grid decay (tools/analysis/decay_kernels.py) computes what the
models' decay-mask path computes, and the comparison tool reads the presets' full-attention stages."""
import pytest
import torch

import mmvisatt.models  # noqa: F401
from decay_kernels import compare_decay_kernels, decay_stages, flex_decayed_attention, mask_decayed_attention
from mmvisatt.models.layers.spatial_decay import SpatialDecay


@pytest.mark.parametrize('metric', ['manhattan', 'euclidean'])
def test_score_mod_equals_the_decay_mask(metric):
    torch.manual_seed(0)
    height, width = 5, 7
    decay = SpatialDecay(3, 2., 4.).double()
    # strong decays too: far pairs then sit on the bias floor in both paths
    decay.log_gamma.mul_(torch.tensor([1., 10., 4000.], dtype=torch.float64))
    # FlexAttention has no backward on the CPU; tests/test_cuda.py compares the gradients
    q, k, v = (torch.randn(2, 3, height * width, 4, dtype=torch.float64) for _ in range(3))
    flex = flex_decayed_attention(q, k, v, decay.log_gamma, width, metric)
    mask = mask_decayed_attention(q, k, v, decay, height, width, metric)
    torch.testing.assert_close(flex, mask, rtol=1e-12, atol=1e-12)


def test_decay_stages_of_the_presets():
    rmt = decay_stages('rmt_t', (800, 1333))
    assert [(s['grid'], s['heads'], s['head_dim'], s['metric']) for s in rmt] == [
        ((50, 84), 8, 32, 'manhattan'), ((25, 42), 16, 32, 'manhattan')]
    evt = decay_stages('evt_t', (800, 1333))
    assert [(s['grid'], s['heads'], s['metric']) for s in evt] == [((25, 42), 16, 'euclidean')]
    with pytest.raises(ValueError, match='rmt_<size> or evt_<size>'):
        decay_stages('swin_t', (224, 224))


def test_comparison_times_both_ways_and_checks_their_values():
    stage = dict(name='tiny', grid=(6, 9), heads=2, head_dim=8, init_value=2., heads_range=4., metric='manhattan')
    results = compare_decay_kernels(stage, batch_size=1, dtype=torch.float32, device='cpu', compile_flex=False,
                                    warmup=0, repeats=2)
    assert set(results) == {'mask + sdpa', 'flex score_mod'}
    for result in results.values():
        assert len(result['times_ms']) == 2 and result['time_ms'] > 0 and result['step_peak_mib'] is None
        assert result['passes'] == 'forward'
        assert result['relative_difference'] < 1e-5
