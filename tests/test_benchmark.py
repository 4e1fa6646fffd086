"""The benchmark tool on tiny models: what it measures, its JSON and table, comparisons, dtypes and errors.

Times are never asserted (the machine is shared); only that they were measured and reported consistently.
"""
import json
import math
import os
import os.path as osp
import re
import subprocess
import sys

import pytest
import torch

from benchmark import (BenchmarkError, BenchmarkSettings, ModelSpec, Workload, cli, main, resolve, run_benchmark,
                       summarize)

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
TINY = "{'embed_dims': 16, 'depths': (1, 1, 1, 1), 'num_heads': (1, 1, 2, 2)}"
WIDER = "{'embed_dims': 32, 'depths': (1, 1, 1, 1), 'num_heads': (1, 1, 2, 2)}"
QUICK = ['--shape', '64', '--batch-size', '2', '--warmup', '1', '--repeats', '2']
TIME_FIELDS = {'median', 'q1', 'q3', 'iqr', 'mean', 'std', 'min', 'max', 'n'}


def _check_timing(entry: dict, repeats: int, batch: int) -> None:
    stats = entry['time_ms']
    assert set(stats) == TIME_FIELDS and stats['n'] == repeats == len(entry['times_ms'])
    assert 0 < stats['min'] <= stats['q1'] <= stats['median'] <= stats['q3'] <= stats['max']
    assert stats['iqr'] == pytest.approx(stats['q3'] - stats['q1'])
    assert entry['throughput'] == pytest.approx(batch / (stats['median'] / 1e3))


def test_backbone_all_measurements_json(tmp_path, capsys):
    out = tmp_path / 'bench.json'
    main(['--backbone', 'ReSwinTransformer', '--arch', TINY, *QUICK, '--out', str(out)])
    table = capsys.readouterr().out
    report = json.loads(out.read_text())
    assert report['settings']['shape'] == [64, 64] and report['settings']['dtype'] == 'float32'
    assert {'cpu', 'logical_cpus', 'torch_threads', 'torch', 'platform'} <= set(report['machine'])
    assert report['measure'] == ['inference', 'train', 'inference-memory', 'train-memory']
    model, = report['models']
    assert model['kind'] == 'backbone' and model['type'] == 'ReSwinTransformer' and model['with_cp'] is False
    assert model['params']['total'] == sum(
        p.numel() for p in Workload(ModelSpec('ReSwinTransformer', arch=eval(TINY)), BenchmarkSettings(
            shape=(64, 64))).model.parameters())
    for mode in ('inference', 'train'):
        _check_timing(model[mode], repeats=2, batch=2)
        memory = model['memory'][mode]
        assert memory['steps'] == 2 and memory['hwm_reset'] is True
        # the passes allocate (activations; gradients and AdamW state when training) above the built model
        assert memory['step_peak_mib'] > 0
        assert memory['peak_mib'] == pytest.approx(memory['baseline_mib'] + memory['step_peak_mib'])
    for label in ('inference latency', 'train step', 'inference peak', 'train step peak', 'params (M)'):
        assert label in table
    assert f'wrote {out}' in table


def test_compare_prints_ratios(tmp_path, capsys):
    out = tmp_path / 'compare.json'
    report = main(['--backbone', 'ReSwinTransformer', '--arch', TINY, '--compare', f'ReSwinTransformer:{WIDER}',
                   *QUICK, '--measure', 'inference', 'train', '--out', str(out)])
    table = capsys.readouterr().out
    first, second = report['models']
    assert second['params']['total'] > first['params']['total']
    ratios = json.loads(out.read_text())['ratios']
    assert ratios['params.total'] == pytest.approx(second['params']['total'] / first['params']['total'])
    assert ratios['inference.time_ms.median'] == pytest.approx(
        second['inference']['time_ms']['median'] / first['inference']['time_ms']['median'])
    assert set(ratios) == {'params.total', 'inference.time_ms.median', 'inference.throughput',
                           'train.time_ms.median', 'train.throughput', 'flops.forward_gflop',
                           'inference.achieved_tflops', 'train.achieved_tflops', 'train.peak_share'}
    assert second['ratios'] == ratios
    header = next(line for line in table.splitlines() if line.startswith('metric'))
    assert 'ratio 2/1' in header
    params_row = next(line for line in table.splitlines() if line.startswith('params (M)'))
    assert params_row.split()[-1] == f"{ratios['params.total']:.2f}x"


def test_bf16_on_cpu():
    settings = BenchmarkSettings(shape=(64, 64), batch_size=2, dtype='bfloat16')
    assert settings.dtype == 'bf16'
    workload = Workload(ModelSpec('ReSwinTransformer', arch=eval(TINY)), settings)
    outputs = workload.infer()
    assert all(o.dtype == torch.bfloat16 for o in outputs)
    before = [p.detach().clone() for p in workload.model.parameters()]
    loss = workload.train_step()
    assert math.isfinite(float(loss))
    # weights stay float32 (autocast) and the optimizer step moved them
    assert all(p.dtype == torch.float32 for p in workload.model.parameters())
    assert any(not torch.equal(a, p) for a, p in zip(before, workload.model.parameters()))
    lines, done = [], []
    report = run_benchmark([ModelSpec('ReSwinTransformer', arch=eval(TINY))] * 2,
                           BenchmarkSettings(shape=(64, 64), dtype='bf16', warmup=0, repeats=1), ['train'],
                           log=lines.append, on_model=lambda r: done.append(len(r['models'])))
    assert report['settings']['dtype'] == 'bf16' and report['models'][0]['train']['time_ms']['n'] == 1
    # each model's numbers are logged and handed on as it ends: a run stopped by a time limit keeps them
    assert done == [1, 2]
    assert sum(line.startswith(f"{report['models'][0]['name']}: train ") and ' ms' in line for line in lines) == 2


def test_with_cp_toggles_the_backbone():
    spec = ModelSpec('ReSwinTransformer', arch=eval(TINY))
    for with_cp in (True, False):
        workload = Workload(spec, BenchmarkSettings(shape=(64, 64), with_cp=with_cp))
        assert workload.with_cp is with_cp
        assert all(stage.with_cp is with_cp for stage in workload.model.stages)
        workload.train_step()


def test_score_chunk_size_is_a_process_setting():
    from mmvisatt.models.layers.score_memory import score_chunk_numel, set_score_chunk_numel
    default = score_chunk_numel()
    try:
        BenchmarkSettings(score_chunk_numel=1 << 20).apply()
        assert score_chunk_numel() == 1 << 20
        BenchmarkSettings().apply()  # None keeps what is set
        assert score_chunk_numel() == 1 << 20
    finally:
        set_score_chunk_numel(default)


def test_detection_config_batch_and_options(tiny_det_config):
    spec = ModelSpec(tiny_det_config, cfg_options={'model.train_cfg.rcnn.sampler.num': 16,
                                                   'model.test_cfg.rpn.max_per_img': 20,
                                                   'model.test_cfg.rcnn.max_per_img': 5})
    settings = BenchmarkSettings(shape=(64, 96), batch_size=2, with_cp=True, warmup=0, repeats=1)
    workload = Workload(spec, settings)
    assert workload.kind == 'det' and workload.with_cp is True
    assert workload.model.backbone.init_cfg is None
    assert [tuple(img.shape) for img in workload.batch['inputs']] == [(3, 64, 96)] * 2
    sample = workload.batch['data_samples'][0]
    assert len(sample.gt_instances) > 0 and sample.gt_instances.masks.height == 64
    assert math.isfinite(float(workload.train_step()))
    predictions = workload.infer()
    assert len(predictions) == 2 and len(predictions[0].pred_instances) <= 5
    report = run_benchmark([spec], settings, ['train'])
    assert report['models'][0]['params']['backbone'] < report['models'][0]['params']['total']


def test_cpu_clock_times_the_passes_and_says_so(tmp_path, capsys, monkeypatch):
    """--clock cpu reads time.process_time around each pass: a fake clock that advances 5 ms per call gives 5 ms
    passes whatever the pass took, which the wall clock would not."""
    import benchmark
    ticks = iter(range(10 ** 6))
    monkeypatch.setitem(benchmark.CLOCKS, 'cpu', lambda: next(ticks) * 5e-3)
    out = tmp_path / 'cpu.json'
    main(['--backbone', 'ReSwinTransformer', '--arch', TINY, *QUICK, '--measure', 'inference', '--clock', 'cpu',
          '--out', str(out)])
    table = capsys.readouterr().out
    report = json.loads(out.read_text())
    assert report['settings']['clock'] == 'cpu'
    assert report['models'][0]['inference']['times_ms'] == [5.0, 5.0]
    settings_line = next(line for line in table.splitlines() if 'timed repeats' in line)
    assert '(CPU time)' in settings_line


def test_cpu_clock_splits_user_and_system_time(tmp_path, capsys, monkeypatch):
    """With --clock cpu each pass also gets its user and system time and minor page faults (getrusage
    differences): a fake usage that advances 3 ms user, 1 ms system and 10 faults per reading gives exactly those
    per pass. The wall clock reports no split."""
    import benchmark
    readings = iter(range(10 ** 6))

    def fake_usage():
        n = next(readings)
        return n * 3e-3, n * 1e-3, n * 10

    monkeypatch.setattr(benchmark, 'cpu_usage', fake_usage)
    out = tmp_path / 'split.json'
    main(['--backbone', 'ReSwinTransformer', '--arch', TINY, *QUICK, '--measure', 'inference', '--clock', 'cpu',
          '--out', str(out)])
    table = capsys.readouterr().out
    split = json.loads(out.read_text())['models'][0]['inference']['cpu_split']
    assert split['user_ms']['median'] == pytest.approx(3.0) and split['system_ms']['median'] == pytest.approx(1.0)
    assert split['minor_faults']['median'] == 10 and split['user_ms']['n'] == 2
    assert 'inference user time' in table and 'inference system time' in table
    main(['--backbone', 'ReSwinTransformer', '--arch', TINY, *QUICK, '--measure', 'inference', '--out', str(out)])
    assert 'cpu_split' not in json.loads(out.read_text())['models'][0]['inference']
    assert 'user time' not in capsys.readouterr().out


def test_several_models_side_by_side_with_flop_rates(tmp_path, capsys):
    """Three models in one process, a timm one among them: each later model's ratios to the first, FLOPs of every
    backbone, and achieved TFLOP/s = FLOPs (x3 for a training step) / median time, as a share of the measured
    matrix-product rate; the Markdown table has a row per model."""
    markdown = tmp_path / 'table.md'
    report = main(['--backbone', 'ReSwinTransformer', '--arch', TINY, '--compare', f'ReSwinTransformer:{WIDER}',
                   'timm.mvitv2_tiny', '--shape', '64', '96', '--warmup', '0', '--repeats', '2',
                   '--measure', 'inference', 'train', '--markdown', str(markdown)])
    first, wider, mvit = report['models']
    assert 'ratios' not in report and 'ratios' not in first
    assert wider['ratios']['params.total'] == pytest.approx(wider['params']['total'] / first['params']['total'])
    assert mvit['name'] == 'timm.mvitv2_tiny' and mvit['type'] == 'TimmFeatures'
    assert mvit['params']['total'] == pytest.approx(23.36e6, rel=0.01)  # mvitv2_tiny without head and norm
    peak = report['peak_tflops']
    assert peak['matmul_measured'] > 0 and peak['matmul_size'] == 512 and peak['given'] is None
    for result in report['models']:
        flops = result['flops']['forward_gflop'] * 1e9
        assert flops > 0 and result['flops']['train_gflop'] == pytest.approx(3 * flops / 1e9)
        for mode, factor in (('inference', 1), ('train', 3)):
            entry = result[mode]
            assert entry['timing'] == 'perf_counter'
            achieved = factor * flops / (entry['time_ms']['median'] / 1e3) / 1e12
            assert entry['achieved_tflops'] == pytest.approx(achieved)
            assert entry['peak_share'] == pytest.approx(achieved / peak['matmul_measured'])
    rows = [line for line in markdown.read_text().splitlines() if line.startswith('| `')]
    assert [row.split('`')[1] for row in rows] == [m['name'] for m in report['models']]
    assert 'train TFLOP/s' in capsys.readouterr().out


def test_forward_flops_are_the_known_count():
    """timm's Swin-T at 224x224 is 4.5 GMACs with its classifier (the paper's "4.5G FLOPs"); its four stages
    without the head and final norm are 4.49 G multiply-adds, 8.98 GFLOP in the benchmark's 2-per-MAC count."""
    workload = Workload(ModelSpec('timm.swin_tiny_patch4_window7_224'), BenchmarkSettings(shape=(224, 224)))
    assert workload.forward_flops() / 1e9 == pytest.approx(8.98, rel=0.01)
    doubled = Workload(ModelSpec('timm.swin_tiny_patch4_window7_224'),
                       BenchmarkSettings(shape=(224, 224), batch_size=2))
    assert doubled.forward_flops() == 2 * workload.forward_flops()


def test_timm_features_pad_the_input_for_their_patch_embedding():
    """A 70x45 input is padded to 96x64 (multiples of 32) for timm's patch embeddings: four maps at strides 4-32
    (Swin's channels last, as timm gives them)."""
    from benchmark import TimmFeatures
    for name, layout in (('swin_tiny_patch4_window7_224', 'NHWC'), ('mvitv2_tiny', 'NCHW')):
        with torch.no_grad():
            outs = TimmFeatures(name, (70, 45)).eval()(torch.randn(1, 3, 70, 45))
        shapes = [tuple(o.shape[1:3] if layout == 'NHWC' else o.shape[2:]) for o in outs]
        assert shapes == [(24, 16), (12, 8), (6, 4), (3, 2)], name


def test_suite_targets():
    """The suite's models all resolve, and its targets read the report: step ratios bounded from above, FLOP-rate
    ratios from below; a target whose models are missing is left out."""
    from benchmark import SUITE_TARGETS, SUITES, evaluate_targets, markdown_report, parse_spec
    for name in SUITES['t-presets']:
        assert resolve(parse_spec(name), shape=(64, 96)).is_backbone
    targets = SUITE_TARGETS['t-presets']
    named = {t[1] for t in targets} | {t[2] for t in targets}
    assert named <= set(SUITES['t-presets'])

    def model(name, step_ms, tflops):
        return dict(name=name, train=dict(time_ms=dict(median=step_ms), achieved_tflops=tflops))
    report = dict(models=[model('timm.swin_tiny_patch4_window7_224', 100., 200.), model('reswin_t', 110., 150.),
                          model('timm.mvitv2_tiny', 100., 100.), model('remvit_t', 120., 90.),
                          model('rmt_t', 150., 139.), model('shunted_t', 90., 141.)],
                  settings=dict(dtype='bf16', batch_size=2, shape=[800, 1333], warmup=3, repeats=10),
                  machine=dict(gpu='Test GPU', torch='x'), date='today')
    rows = {row['model']: row for row in evaluate_targets(report, targets)}
    assert set(rows) == {'reswin_t', 'remvit_t', 'rmt_t', 'shunted_t'}
    assert rows['reswin_t']['ratio'] == pytest.approx(1.1) and rows['reswin_t']['met']
    assert rows['remvit_t']['ratio'] == pytest.approx(1.2) and not rows['remvit_t']['met']
    assert rows['rmt_t']['ratio'] == pytest.approx(0.695) and not rows['rmt_t']['met']
    assert rows['shunted_t']['ratio'] == pytest.approx(0.705) and rows['shunted_t']['met']
    report['targets'] = list(rows.values())
    text = markdown_report(report)
    assert 'Test GPU' in text and '| remvit_t / ReMViTv2-T' not in text
    assert '| ReMViTv2-T train step / timm MViTv2-T | 1.20 | <= 1.15 | **no** |' in text


def test_summarize():
    stats = summarize([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (stats['median'], stats['q1'], stats['q3'], stats['iqr']) == (3.0, 2.0, 4.0, 2.0)
    assert (stats['min'], stats['max'], stats['n']) == (1.0, 5.0, 5)
    assert summarize([7.0])['iqr'] == 0.0


@pytest.mark.parametrize('argv, message', [
    (['--backbone', 'NoSuchNet'], "Unknown backbone 'NoSuchNet'"),
    (['--backbone', 'RMT', '--arch', 'zz'], "Unknown RMT arch 'zz'"),
    (['configs/no_such_config.py'], 'does not exist'),
    (['--backbone', 'RMT', '--dtype', 'bf16', '--shape', '0'], 'shape must be two positive integers'),
    ([], 'one of a CONFIG file, --backbone NAME or --suite NAME'),
    (['--suite', 't-presets', '--backbone', 'RMT'], 'one of a CONFIG file, --backbone NAME or --suite NAME'),
    (['--backbone', 'timm.no_such_net'], "timm {} has no model 'no_such_net'".format(__import__('timm').__version__)),
    (['--backbone', 'timm.mvitv2_tiny', '--arch', 't'], 'whose name is its arch'),
    (['--backbone', 'mmdet.SwinTransformer', '--arch', 't', '--measure', 'inference'], 'takes no `arch`'),
])
def test_bad_requests_give_clear_errors(argv, message):
    with pytest.raises(SystemExit) as exc:
        cli(argv)
    assert message in str(exc.value)


def test_unknown_backbone_lists_the_choices():
    with pytest.raises(BenchmarkError) as exc:
        Workload(ModelSpec('NoSuchNet'), BenchmarkSettings())
    text = str(exc.value)
    assert 'reswin_t' in text and 'mmdet.SwinTransformer' in text and 'config file' in text


def test_presets_resolve_without_pretraining_or_syncbn():
    resolved = resolve(ModelSpec('fan_hybrid_t'), with_cp=True)
    assert resolved.is_backbone and resolved.cfg['type'] == 'FANHybrid' and resolved.cfg['arch'] == 'hybrid_t'
    assert resolved.cfg['init_cfg'] is None and resolved.cfg['norm_cfg']['type'] == 'BN'
    assert resolved.cfg['with_cp'] is True


def _fast_path_ratios():
    """tools/analysis/fast_path_ratios.py as a module (tools/ is not a package)."""
    import importlib.util
    import os.path as osp
    path = osp.join(osp.dirname(osp.dirname(osp.abspath(__file__))), 'tools', 'analysis', 'fast_path_ratios.py')
    spec = importlib.util.spec_from_file_location('fast_path_ratios', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_reswin_detector_against_swin(tiny_det_config, tmp_path, capsys):
    tool = _fast_path_ratios()
    config = tmp_path / 'mask_rcnn_reswin_tiny_few_boxes.py'
    config.write_text(f'_base_ = [{tiny_det_config!r}]\n'
                      'model = dict(test_cfg=dict(rpn=dict(max_per_img=20), rcnn=dict(max_per_img=5)))\n')
    reswin, swin, batch, shared = tool.build_detector_pair(str(config), (64, 96))
    assert type(swin.backbone).__name__ == 'SwinTransformer'
    assert swin.backbone.stages[0].blocks[0].attn.w_msa.num_heads == 1
    assert [len(stage.blocks) for stage in swin.backbone.stages] == [1, 1, 1, 1]
    ours, theirs = reswin.state_dict(), swin.state_dict()
    # everything but the backbone is shared, so the comparison times the backbones' difference only
    outside = [k for k in theirs if not k.startswith('backbone.')]
    assert outside and set(outside) <= set(shared)
    assert all(torch.equal(ours[k], theirs[k]) for k in shared)
    assert [tuple(img.shape) for img in batch['inputs']] == [(3, 64, 96)]
    threads = torch.get_num_threads()
    try:
        ta, tb = tool.main(['reswin-det', '--config', str(config), '--shape', '64', '96', '--repeats', '1',
                            '--warmup', '0', '--clock', 'cpu'])
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert ta > 0 and tb > 0 and 'cpu clock' in out and 'detections in the last pass' in out


def test_remvit_pair_takes_a_non_square_input(capsys):
    """timm's MViTv2 asserts a square img_size; the tool builds it square at the longer side."""
    threads = torch.get_num_threads()
    try:
        ta, tb = _fast_path_ratios().main(['remvit', '--shape', '32', '64', '--repeats', '1', '--warmup', '0'])
    finally:
        torch.set_num_threads(threads)
    assert ta > 0 and tb > 0 and '32x64' in capsys.readouterr().out


def test_reswin_pair_builds_swin_from_the_reswin_config(capsys):
    """The Swin side of ``reswin`` is derived from ReSwin-T's settings (``swin_like``), not written out."""
    tool = _fast_path_ratios()
    swin_cfg = tool.swin_like(dict(type='ReSwinTransformer', arch='t'))
    assert (swin_cfg['embed_dims'], swin_cfg['depths'], swin_cfg['num_heads']) == (96, (2, 2, 6, 2), (3, 6, 12, 24))
    threads = torch.get_num_threads()
    try:
        ta, tb = tool.main(['reswin', '--shape', '32', '32', '--repeats', '1', '--warmup', '0'])
    finally:
        torch.set_num_threads(threads)
    assert ta > 0 and tb > 0 and 'mmdet Swin-T' in capsys.readouterr().out


def test_cpu_clock_is_refused_for_a_gpu_and_unknown_clocks_are_named(monkeypatch):
    with pytest.raises(BenchmarkError, match="Unknown clock 'gpu'"):
        BenchmarkSettings(clock='gpu')
    # the settings only ask whether CUDA exists; pretend it does to reach the clock check
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    with pytest.raises(BenchmarkError, match='use --clock wall'):
        BenchmarkSettings(device='cuda', clock='cpu')
    assert BenchmarkSettings(device='cuda').clock == 'wall'


def test_fast_path_pair_splits_cpu_time_into_user_and_system(capsys):
    """With the CPU clock the tool also reports user and system time and page faults: system time (the kernel
    zeroing fresh pages) swings between runs, so the user-time ratio is the one that compares computation."""
    tool = _fast_path_ratios()
    threads = torch.get_num_threads()
    try:
        ta, tb = tool.main(['fast-path', 'EVT', 't', '--shape', '64', '64', '--repeats', '2', '--warmup', '0',
                            '--clock', 'cpu'])
        cpu_out = capsys.readouterr().out
        # elapsed time has no user and system parts: no split
        tool.main(['fast-path', 'EVT', 't', '--shape', '64', '64', '--repeats', '1', '--warmup', '0'])
        wall_out = capsys.readouterr().out
    finally:
        torch.set_num_threads(threads)
    assert ta > 0 and tb > 0
    split = [line for line in cpu_out.splitlines() if line.startswith('CPU time split')]
    assert len(split) == 1 and 'minor page faults' in split[0]
    pattern = r'user fused_attn=False ([\d.]+) ms, fused_attn=True ([\d.]+) ms'
    users = [float(v) for v in re.findall(pattern, split[0])[0]]
    assert all(u >= 0 for u in users) and sum(users) > 0
    assert 'CPU time split' not in wall_out


def test_profile_splits_a_pass_by_kind_of_op(capsys):
    """--profile: one pass's self CPU time by kind of op; the kinds add up to the total, and a model of linear layers
    spends its time in the 'linear layers' kind."""
    tool = _fast_path_ratios()
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
    x = torch.randn(512, 64)
    kinds = tool.profile_pass(lambda m: m(x), model)
    assert set(kinds) == {*tool.OP_KINDS, 'other', 'total'}
    assert math.isclose(sum(v for k, v in kinds.items() if k != 'total'), kinds['total'], rel_tol=1e-9)
    assert kinds['linear layers (GEMM)'] > 0 and kinds['attention kernels'] == 0 and kinds['convolutions'] == 0
    threads = torch.get_num_threads()
    try:
        tool.main(['fast-path', 'EVT', 't', '--shape', '64', '64', '--repeats', '1', '--warmup', '0', '--profile'])
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert 'self CPU time by kind of op' in out and '  attention kernels: ' in out and '  total: ' in out


@pytest.mark.parametrize('allocator', ['glibc-retain', 'jemalloc'])
def test_allocator_option_reexecutes_with_the_setting(allocator, tmp_path):
    """``--allocator`` restarts the command with the allocator's environment (what the timings ran under is in the
    report); a missing jemalloc is a one-line error that says how to install it."""
    from benchmark import JEMALLOC_LIBRARIES
    out = tmp_path / 'report.json'
    proc = subprocess.run([sys.executable, osp.join(ROOT, 'tools', 'analysis', 'benchmark.py'), '--backbone', 'RMT',
                           '--arch', "{'embed_dims': (16, 32, 64), 'depths': (1, 1, 1), 'num_heads': (2, 2, 4)}",
                           '--shape', '64', '--measure', 'inference', '--repeats', '1', '--warmup', '0',
                           '--threads', '1', '--allocator', allocator, '--out', str(out)],
                          capture_output=True, text=True, cwd=ROOT)
    if allocator == 'jemalloc' and not any(osp.exists(p) for p in JEMALLOC_LIBRARIES):
        assert proc.returncode != 0 and 'apt-get install libjemalloc2' in proc.stderr
        return
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f'allocator {allocator}' in proc.stdout
    assert json.loads(out.read_text())['allocator'] == allocator


@pytest.mark.slow
def test_gpu_check_script_runs_on_the_cpu(tmp_path):
    """``tools/gpu_check.sh run --device cpu --quick``: every step runs (the CUDA tests skip with their reason) and
    leaves its results: the Mask R-CNN training and its check, a detector's and a segmentor's steps, the suite's
    twelve models and targets."""
    env = dict(os.environ, OUT=str(tmp_path), GPU_CHECK_PYTHON=sys.executable)
    proc = subprocess.run(['bash', osp.join(ROOT, 'tools', 'gpu_check.sh'), 'run', '--device', 'cpu', '--quick'],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        'benchmark.json', 'benchmark.log', 'benchmark.md', 'cuda_tests.log', 'cuda_tests.xml', 'cuda_tests_first.xml',
        'decay_attention.json', 'dense_steps.json', 'env.txt', 'residual_fused.json', 'residual_fused_beside.json',
        'residual_reference.json', 'residual_reference_beside.json', 'roofline_beside.json', 'train', 'train.log',
        'train_check.json']
    # first, ReViT-B's and ReMViTv2-T's steps on both residual-attention paths, each beside its own estimate
    residual = {path: json.loads((tmp_path / f'residual_{path}_beside.json').read_text())
                for path in ('fused', 'reference')}
    assert all([row['model'] for row in rows] == ['revit_b', 'remvit_t'] for rows in residual.values())
    assert all(row['measured_ms'] > 0 for rows in residual.values() for row in rows)
    assert all(ref['estimate_ms'] > fused['estimate_ms']
               for fused, ref in zip(residual['fused'], residual['reference']))
    check = json.loads((tmp_path / 'train_check.json').read_text())
    assert check['iterations'] == 4 and check['non_finite'] == []
    steps = json.loads((tmp_path / 'dense_steps.json').read_text())
    assert sorted(row['config'] for row in steps) == ['mask_rcnn_reswin_t_1x.py', 'upernet_reswin_t_160k_ade20k.py']
    assert all(row['seconds_per_iter'] > 0 and 'error' not in row for row in steps), steps
    assert all(row['table_per_gpu'] > 0 for row in steps)  # each step beside its row of the memory table
    assert 'torch' in (tmp_path / 'env.txt').read_text()
    tests_log = (tmp_path / 'cuda_tests.log').read_text()
    assert re.search(r'\d+ skipped', tests_log) and 'needs a CUDA GPU' in tests_log and 'failed' not in tests_log
    report = json.loads((tmp_path / 'benchmark.json').read_text())
    assert report['suite'] == 't-presets' and len(report['models']) == 12 and len(report['targets']) == 10
    assert all(m['train']['achieved_tflops'] > 0 for m in report['models'])
    assert (tmp_path / 'benchmark.md').read_text().count('| `') == 12
    beside = json.loads((tmp_path / 'roofline_beside.json').read_text())
    assert len(beside) == 12 and all(row['measured_ms'] > 0 and row['estimate_ms'] > 0 for row in beside)
    assert 'test_cuda_equals_cpu_t_preset[FANViT-vit_t]' in (tmp_path / 'cuda_tests_first.xml').read_text()
    decay = json.loads((tmp_path / 'decay_attention.json').read_text())
    assert {row['way'] for row in decay['rows']} == {'mask + sdpa', 'flex score_mod'} and len(decay['rows']) == 6
    assert all(row['relative_difference'] < 1e-5 for row in decay['rows'])
