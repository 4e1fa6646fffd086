"""What a GPU user relies on, checked on a CUDA device: ``pytest tests/test_cuda.py -m cuda`` (every test here is
marked ``cuda`` and skipped, with the reason, where torch sees no GPU; ``tools/gpu_check.sh`` runs them on a lent
machine).

- the fused and reference paths agree on CUDA (float64 formulas, float32 as users run them; outputs and gradients),
  for the tiny case and the T-size preset of every form with two paths;
- CUDA computes what the CPU computes on the same weights;
- bf16 and fp16 autocast (fp16 with a dynamic GradScaler, as ``AmpOptimWrapper``) at 1333x800, forward and
  backward, stay finite under CUDA's own autocast policy;
- the chunked score strategies (``score_memory='handoff'`` and ``'factors'``, whose ``RowChunkAttention`` is a
  custom autograd Function) run and give the reference's outputs and gradients;
- ``with_cp`` cuts the training step's ``max_memory_allocated`` at 800x1216 by at least 40%, and leaves BatchNorm
  statistics advanced once per step;
- the geometry caches (window masks, decay distances, token groups, residual alignment indices) hand every model
  tensors on its own device when one process runs the same shapes on both;
- the benchmark's CUDA timing, memory and FLOP-rate reports.

TF32 is off in every test (float32 comparisons would otherwise compare 10-bit products).
"""
import gc
from contextlib import contextmanager
from typing import Dict

import pytest
import torch
from mmengine.registry import MODELS

from mmvisatt.models.layers.score_memory import RowChunkAttention
from mmvisatt.testing.cases import T_PRESET_IDS, T_PRESETS, TINY_CASES, build, fused_reference_pair

pytestmark = pytest.mark.cuda
CUDA = torch.device('cuda')
# with BatchNorm somewhere (stems, downsampling, convolutional stages)
BN_CASES = ['rmt', 'evt', 'shunted', 'fan_vit', 'fan_hybrid', 'fan_swin']


@pytest.fixture(autouse=True)
def full_float32():
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
    gc.collect()
    torch.cuda.empty_cache()


def _loss(outs) -> torch.Tensor:
    return sum(o.float().square().mean() for o in outs)


def _step(model: torch.nn.Module, x: torch.Tensor):
    """Outputs (detached, on the CPU, float64) and parameter gradients (likewise) of one training pass."""
    model.train()
    model.zero_grad(set_to_none=True)
    outs = model(x)
    _loss(outs).backward()
    grads = {n: p.grad.detach().double().cpu() for n, p in model.named_parameters() if p.grad is not None}
    return [o.detach().double().cpu() for o in outs], grads


def _forward(model: torch.nn.Module, x: torch.Tensor):
    with torch.no_grad():
        return [o.double().cpu() for o in model.eval()(x)]


def assert_tensors_close(actual, expected, rtol: float) -> None:
    """Each tensor within ``rtol`` of its reference in relative Frobenius norm; a tensor far smaller than the
    largest one (a gradient that nearly vanishes) is held to ``rtol`` of a thousandth of the largest instead."""
    if isinstance(expected, dict):
        assert actual.keys() == expected.keys() and expected, sorted(set(actual) ^ set(expected))[:5]
        names, actual, expected = list(expected), [actual[k] for k in expected], list(expected.values())
    else:
        names = [f'output {i}' for i in range(len(expected))]
        assert len(actual) == len(expected) > 0
    floor = 1e-3 * max(e.norm() for e in expected)
    for name, a, e in zip(names, actual, expected):
        assert a.shape == e.shape, (name, a.shape, e.shape)
        assert torch.isfinite(a).all(), f'{name} is not finite'
        error = (a - e).norm() / max(e.norm(), floor)
        assert error <= rtol, f'{name}: relative error {error:.3g} > {rtol:g}'


# ------------------------------------------------------------------------------------ fused == reference on CUDA


@pytest.mark.parametrize('dtype,rtol', [(torch.float64, 1e-9), (torch.float32, 1e-4)], ids=['float64', 'float32'])
@pytest.mark.parametrize('name', list(TINY_CASES))
def test_fused_equals_reference_tiny(name, dtype, rtol):
    fused, reference = (m.to(CUDA, dtype) for m in fused_reference_pair(*TINY_CASES[name]))
    # odd sizes: padded windows / groups and ragged pooled maps; two images (FAN-Swin's windows join the batch)
    x = torch.randn(2, 3, 70, 45, dtype=dtype, device=CUDA)
    assert_tensors_close(_forward(fused, x), _forward(reference, x), rtol)
    outs, grads = _step(fused, x)
    ref_outs, ref_grads = _step(reference, x)
    assert_tensors_close(outs, ref_outs, rtol)
    assert_tensors_close(grads, ref_grads, 10 * rtol)


@pytest.mark.parametrize('name,arch', T_PRESETS, ids=T_PRESET_IDS)
def test_fused_equals_reference_t_preset(name, arch):
    fused, reference = (m.to(CUDA) for m in fused_reference_pair(name, dict(arch=arch), scale=0.02))
    x = torch.randn(1, 3, 230, 314, device=CUDA)
    outs, grads = _step(fused, x)
    ref_outs, ref_grads = _step(reference, x)
    assert_tensors_close(outs, ref_outs, 1e-4)
    assert_tensors_close(grads, ref_grads, 1e-3)


# ------------------------------------------------------------------------------------------ CUDA == CPU


# FAN-ViT and FAN-Hybrid build their Fourier position grid in float32 on every device, as the official module does
# (so that float64 runs reproduce its numbers); CUDA's and the CPU's float32 sin/cos differ in the last bit, which
# moves a float64 step's outputs by up to about 1e-7 and its gradients by about 2e-6 of their norm
FLOAT32_GRID = {'fan_vit', 'fan_hybrid'}


@pytest.mark.parametrize('name', list(TINY_CASES))
def test_cuda_equals_cpu_tiny(name):
    type_name, kwargs = TINY_CASES[name]
    model = build(type_name, **kwargs).double()
    x = torch.randn(2, 3, 70, 45, dtype=torch.float64)
    cpu = _step(model, x)
    gpu = _step(model.to(CUDA), x.to(CUDA))
    outputs, grads = (1e-6, 1e-5) if name in FLOAT32_GRID else (1e-10, 1e-9)
    assert_tensors_close(gpu[0], cpu[0], outputs)
    assert_tensors_close(gpu[1], cpu[1], grads)


@pytest.mark.parametrize('name,arch', T_PRESETS, ids=T_PRESET_IDS)
def test_cuda_equals_cpu_t_preset(name, arch):
    model = build(name, scale=0.02, arch=arch)
    x = torch.randn(1, 3, 230, 314)
    cpu = _step(model, x)
    gpu = _step(model.to(CUDA), x.to(CUDA))
    assert_tensors_close(gpu[0], cpu[0], 1e-4)
    assert_tensors_close(gpu[1], cpu[1], 1e-3)


# ---------------------------------------------------------------------------- half precision at 1333x800


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16], ids=['bf16', 'fp16'])
@pytest.mark.parametrize('name,arch', T_PRESETS, ids=T_PRESET_IDS)
def test_autocast_at_1333x800_is_finite(name, arch, dtype):
    """The full T preset, one training step as ``AmpOptimWrapper`` takes it: outputs finite, and the gradients
    finite once unscaled. fp16's dynamic GradScaler may legitimately skip the first steps while it lowers its
    scale from 2**16, so it gets up to five."""
    torch.manual_seed(0)
    model = MODELS.get(name)(arch=arch).to(CUDA).train()
    model.init_weights()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.)
    scaler = torch.amp.GradScaler('cuda', enabled=dtype == torch.float16)
    x = torch.randn(1, 3, 800, 1333, device=CUDA)
    for attempt in range(5):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast('cuda', dtype=dtype):
            outs = model(x)
        assert all(torch.isfinite(o).all() for o in outs), f'{dtype} forward is not finite'
        scaler.scale(_loss(outs)).backward()
        scaler.unscale_(optimizer)
        bad = [n for n, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
        scaler.step(optimizer)
        scaler.update()
        if not bad:
            break
    assert not bad, f'non-finite gradients after {attempt + 1} steps (scale {scaler.get_scale()}): {bad[:5]}'
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


# ----------------------------------------------------------------------------------- custom autograd Functions


@contextmanager
def _counting(*functions):
    """Counts the calls of each autograd Function's ``apply`` (the class attribute every caller goes through)."""
    calls = {f.__name__: 0 for f in functions}
    originals = {f: f.__dict__['apply'] for f in functions if 'apply' in f.__dict__}

    def counted(function):
        apply = function.apply

        def wrapper(*args, **kwargs):
            calls[function.__name__] += 1
            return apply(*args, **kwargs)
        return wrapper

    for f in functions:
        f.apply = counted(f)
    try:
        yield calls
    finally:
        for f in functions:
            if f in originals:
                f.apply = originals[f]
            else:
                del f.apply


# (case, the strategy)
FUNCTION_CASES = {'remvit-handoff': ('remvit', dict(score_memory='handoff')),
                  'revit-factors': ('revit', dict(score_memory='factors', fold_every=2))}


@pytest.mark.parametrize('dtype,rtol', [(torch.float64, 1e-9), (torch.float32, 1e-4)], ids=['float64', 'float32'])
@pytest.mark.parametrize('case', list(FUNCTION_CASES))
def test_custom_functions_equal_the_plain_path(case, dtype, rtol):
    base, switches = FUNCTION_CASES[case]
    type_name, kwargs = TINY_CASES[base]
    kwargs = dict(kwargs, arch=dict(kwargs['arch'], depth=4) if type_name == 'ReViT' else kwargs['arch'])
    model = build(type_name, **switches, **kwargs).to(CUDA, dtype)
    plain = MODELS.get(type_name)(drop_path_rate=0., **kwargs).to(CUDA, dtype)
    plain.load_state_dict(model.state_dict())
    x = torch.randn(2, 3, 72, 88, dtype=dtype, device=CUDA)
    with _counting(RowChunkAttention) as calls:
        outs, grads = _step(model, x)
    assert all(calls.values()), f'not run: {[k for k, v in calls.items() if not v]}'
    ref_outs, ref_grads = _step(plain, x)
    assert 'alpha' in grads
    assert_tensors_close(outs, ref_outs, rtol)
    assert_tensors_close(grads, ref_grads, 10 * rtol)


# --------------------------------------------------------------------------------- with_cp on the GPU


def _step_peak_mib(name: str, arch: str, with_cp: bool) -> float:
    """``max_memory_allocated`` of one training pass (forward and backward) above what the model and batch hold."""
    torch.manual_seed(0)
    model = MODELS.get(name)(arch=arch, with_cp=with_cp).to(CUDA).train()
    x = torch.randn(1, 3, 800, 1216, device=CUDA)
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    baseline = torch.cuda.memory_allocated()
    _loss(model(x)).backward()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - baseline
    del model, x
    gc.collect()
    torch.cuda.empty_cache()
    return peak / 2 ** 20


@pytest.mark.parametrize('name,arch', T_PRESETS, ids=T_PRESET_IDS)
def test_with_cp_cuts_training_memory_at_800x1216(name, arch):
    without, with_cp = _step_peak_mib(name, arch, False), _step_peak_mib(name, arch, True)
    cut = 1 - with_cp / without
    assert cut >= 0.40, f'with_cp cuts the step peak by {cut:.0%} ({without:.0f} -> {with_cp:.0f} MiB)'


def _bn_stats(model: torch.nn.Module) -> Dict[str, torch.Tensor]:
    return {name: buf.detach().double().cpu() for name, buf in model.named_buffers()
            if name.rsplit('.', 1)[-1] in ('running_mean', 'running_var', 'num_batches_tracked')}


@pytest.mark.parametrize('name', BN_CASES)
def test_with_cp_advances_batchnorm_once_per_step(name):
    type_name, kwargs = TINY_CASES[name]
    plain = build(type_name, **kwargs).to(CUDA, torch.float64)
    ckpt = MODELS.get(type_name)(drop_path_rate=0., with_cp=True, **kwargs).to(CUDA, torch.float64)
    ckpt.load_state_dict(plain.state_dict())
    before = _bn_stats(plain)
    counters = [n for n in before if n.endswith('num_batches_tracked')]
    assert counters, f'{name} has no BatchNorm'
    x = torch.randn(2, 3, 64, 96, dtype=torch.float64, device=CUDA)
    _, grads = _step(plain, x)
    _, ckpt_grads = _step(ckpt, x)
    assert_tensors_close(ckpt_grads, grads, 1e-9)
    after, checkpointed = _bn_stats(plain), _bn_stats(ckpt)
    for n in counters:
        assert after[n] - before[n] == 1
        assert checkpointed[n] - before[n] == 1, f'{n} advanced by {int(checkpointed[n] - before[n])} under with_cp'
    assert_tensors_close({n: checkpointed[n] for n in before}, {n: after[n] for n in before}, 1e-12)


# --------------------------------------------------------------------------------- caches keyed by device


@pytest.mark.parametrize('name', list(TINY_CASES))
def test_caches_hand_each_device_its_own_tensors(name):
    """CPU, then CUDA, then CPU again with the same shapes (a cache keyed without the device would hand the second
    run CPU tensors: a device error), then a new shape on CUDA first: each device computes what the other does."""
    type_name, kwargs = TINY_CASES[name]
    model = build(type_name, **kwargs).double()
    for shape in ((70, 45), (90, 66)):
        x = torch.randn(1, 3, *shape, dtype=torch.float64)
        order = ('cpu', 'cuda', 'cpu') if shape == (70, 45) else ('cuda', 'cpu', 'cuda')
        results = [_forward(model.to(device), x.to(device)) for device in order]
        assert_tensors_close(results[1], results[0], 1e-10)
        assert_tensors_close(results[2], results[0], 1e-12)


# ------------------------------------------------------------------------- the FlexAttention decay candidate


@pytest.mark.parametrize('metric', ['manhattan', 'euclidean'])
def test_flex_decay_equals_the_decay_mask_with_gradients(metric):
    """The compiled FlexAttention score_mod of tools/analysis/decay_kernels.py against the models' mask path
    (the CPU test compares the eager forward; FlexAttention has no CPU backward)."""
    from torch.nn.attention.flex_attention import flex_attention

    from decay_kernels import flex_decayed_attention, mask_decayed_attention
    from mmvisatt.models.layers.spatial_decay import SpatialDecay
    height, width = 20, 26
    decay = SpatialDecay(4, 2., 6.).to(CUDA)
    q, k, v = (torch.randn(2, 4, height * width, 32, device=CUDA, requires_grad=True) for _ in range(3))
    flex = flex_decayed_attention(q, k, v, decay.log_gamma, width, metric, torch.compile(flex_attention))
    mask = mask_decayed_attention(q, k, v, decay, height, width, metric)
    assert_tensors_close([flex.detach().double().cpu()], [mask.detach().double().cpu()], 1e-5)
    grads = [torch.autograd.grad(out.square().sum(), (q, k, v)) for out in (flex, mask)]
    assert_tensors_close([g.double().cpu() for g in grads[0]], [g.double().cpu() for g in grads[1]], 1e-4)


# ------------------------------------------------------------------------------------- the benchmark on CUDA


def test_benchmark_reports_cuda_events_memory_and_flop_rate():
    from benchmark import main
    report = main(['--backbone', 'RMT', '--arch', str(TINY_CASES['rmt'][1]['arch']), '--device', 'cuda',
                   '--shape', '96', '128', '--batch-size', '2', '--dtype', 'bf16', '--warmup', '1', '--repeats', '10',
                   '--compare', 'timm.swin_tiny_patch4_window7_224'])
    assert report['machine']['gpu'] == torch.cuda.get_device_name()
    assert report['peak_tflops']['matmul_measured'] > 0
    for result in report['models']:
        assert result['train']['timing'] == result['inference']['timing'] == 'cuda events'
        assert result['train']['time_ms']['n'] == 10 and result['train']['time_ms']['median'] > 0
        assert result['memory']['train']['method'] == 'cuda max_memory_allocated'
        assert result['memory']['train']['step_peak_mib'] > 0
        assert result['flops']['forward_gflop'] > 0
        assert 0 < result['train']['achieved_tflops'] < report['peak_tflops']['matmul_measured'] * 1.5
