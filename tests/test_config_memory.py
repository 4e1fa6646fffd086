"""What every dense config needs per GPU (tools/analysis/config_memory.py, docs/benchmarks.md): the counter in
float32 and AMP, the training sizes, the calibration against the published OpenMMLab peaks, the meta-device backbone
against the whole step on the CPU, the generated table (a row for every dense config at its current model, batch and
precision, none over 80 GB) and the pre-flight's warning from it."""
import json
import re
import os.path as osp

import pytest
import torch
from mmengine.config import Config

from conftest import CONFIGS, REPO
from mmvisatt.recipes import GPUS
from mmvisatt.testing.device_audit import LiveBytes

import config_memory  # noqa: E402  (tools/analysis, on sys.path through conftest)
from mmvisatt.engine.preflight import memory  # noqa: E402

TABLE = osp.join(REPO, 'docs', 'config_memory.json')


def test_live_bytes_counts_each_storage_from_its_op_to_its_release():
    linear = torch.nn.Linear(100, 100)
    x = torch.randn(8, 100)
    tracker = LiveBytes()
    with tracker:
        tracker.add((list(linear.parameters()), x))
        start = tracker.live
        assert start == (100 * 100 + 100 + 8 * 100) * 4
        y = linear(x)
        view = y.view(-1)  # a view adds nothing
        assert tracker.live == start + 8 * 100 * 4 and view.numel() == 800
        del y, view
    assert tracker.live == start and tracker.peak == start + 8 * 100 * 4


@pytest.mark.parametrize('config,size', [
    ('mask_rcnn_reswin_t_1x.py', (800, 1333)),
    # a 384..600 crop of a photo of either orientation, scaled up to 800 on its short side: a batch of one
    # orientation group holds a 1250x800 and an 800x1333 image and is padded to both
    ('mask_rcnn_reswin_t_3x.py', (1250, 1333)), ('mask_rcnn_evt_l_3x.py', (800, 1333)),  # one image per GPU
    ('retinanet_rmt_t_1x.py', (800, 1333)), ('upernet_rmt_t_160k_ade20k.py', (512, 512)),
    ('fpn_shunted_t_80k_ade20k.py', (512, 512)), ('segformer_fan_hybrid_t_160k_cityscapes.py', (1024, 1024))])
def test_the_training_size_is_the_largest_the_pipeline_makes(config, size):
    assert config_memory.training_size(Config.fromfile(osp.join(CONFIGS, config))) == size


def test_a_batch_without_aspect_ratio_groups_is_padded_to_both_orientations():
    cfg = Config.fromfile(osp.join(CONFIGS, 'mask_rcnn_reswin_t_1x.py'))
    cfg.train_dataloader.batch_sampler = None
    assert config_memory.training_size(cfg) == (1333, 1333)
    cfg.train_dataloader.batch_size = 1
    assert config_memory.training_size(cfg) == (800, 1333)


def test_amp_counts_each_tensor_at_autocasts_width_and_the_weights_copy_once():
    """Under the AMP emulation a matrix product writes 2 bytes per element, a norm 4, and autocast's copy of the
    weight counts once however often the weight is used; the weights themselves stay float32."""
    linear = torch.nn.Linear(100, 100)
    norm = torch.nn.LayerNorm(100)
    x = torch.randn(8, 100)
    tracker = config_memory.AutocastLiveBytes(list(linear.parameters()) + list(norm.parameters()))
    with tracker:
        tracker.add((list(linear.parameters()), x))
        start = tracker.live
        y = linear(x)
        assert tracker.live - start == 8 * 100 * 2 + (100 * 100 + 100) * 2  # the output, the weights' copies
        z = linear(y)
        assert tracker.live - start == 2 * 8 * 100 * 2 + (100 * 100 + 100) * 2  # the copies are kept, not made again
        n = norm(z)
        assert tracker.widths(n) == 4 and tracker.widths(z) == 2
    assert tracker.weight_copies == (100 * 100 + 100) * 2
    assert start == (100 * 100 + 100 + 8 * 100) * 4


@pytest.mark.parametrize('package,name', config_memory.CALIBRATION, ids=[n for _, n in config_memory.CALIBRATION])
def test_the_estimate_holds_against_the_published_openmmlab_swin_peaks(package, name):
    """The table's method on the Swin configs installed with mmdet and mmseg, in the precision each trains in,
    beside the max_memory_allocated their packages publish (8 GPUs x 2 images; GiB). mmdet's four Mask R-CNN rows
    (two fp16 AMP): at or above the published peak and within 1.35 times it. mmseg's three UperNet rows: 0.86-0.88
    of it, an under-count the method cannot close on a CPU (docs/benchmarks.md, "How the rows were checked": mmseg's
    runtime turns on cuDNN's benchmark mode, whose workspaces count in max_memory_allocated); pinned so that it
    does not grow."""
    row, = config_memory.calibrate([name])
    assert row['amp'] == ('_amp-' in name) and row['dtype'] == ('fp16' if row['amp'] else 'float32')
    assert row['batch_per_gpu'] == 2
    low = 1.0 if package == 'mmdet' else 0.85
    assert low <= row['ratio'] <= 1.35, row


def test_the_backbone_on_the_meta_device_counts_what_the_whole_step_counts(tiny_det_config):
    """The same step with the backbone's arithmetic skipped (meta device) and run whole on the CPU: the same bytes
    within 2%, the optimizer state exactly."""
    whole = config_memory.measure_step(tiny_det_config, (96, 128), 'float32', meta_backbone=False)
    meta = config_memory.measure_step(tiny_det_config, (96, 128), 'float32', meta_backbone=True)
    assert meta['optimizer_state'] == whole['optimizer_state'] > 0
    assert meta['weights'] == whole['weights'] and meta['grads'] == whole['grads']
    assert abs(meta['fwd_bwd_peak'] / whole['fwd_bwd_peak'] - 1) < 0.02, (meta, whole)
    # the per-GPU bound: the one-image step plus the activations of each further image
    one = config_memory.per_gpu_bytes(whole, 1)
    assert one == whole['fwd_bwd_peak'] + 2 * whole['grads'] + whole['optimizer_state']  # DDP's buckets
    assert config_memory.per_gpu_bytes(whole, 3) - one == 2 * (whole['fwd_bwd_peak'] - whole['weights'])


@pytest.fixture(scope='module')
def table():
    with open(TABLE) as f:
        return json.load(f)


def test_every_dense_config_has_a_row_of_its_model_and_batch_and_fits_80_gb(table):
    rows = table['rows']
    assert sorted(rows) == sorted(config_memory.dense_configs())
    limit = config_memory.LIMIT_GB * config_memory.GB
    over = []
    for name, row in rows.items():
        cfg = Config.fromfile(osp.join(CONFIGS, name))
        assert row['batch_per_gpu'] == cfg.train_dataloader.batch_size, name
        assert tuple(row['shape']) == config_memory.training_size(cfg), name
        assert row['key'] == config_memory.model_key(cfg, tuple(row['shape']), row['dtype']), \
            f'{name}: the model changed since its row was measured; run tools/analysis/config_memory.py {name}'
        assert row['per_gpu'] == config_memory.per_gpu_bytes(row['step'], row['batch_per_gpu'])
        # in the precision the recipe trains in, with the attention kernels a GPU takes
        assert row['dtype'] == (memory.amp_dtype(cfg) or 'float32') and row['kernels'] == 'gpu', name
        if row['per_gpu'] > limit:
            over.append((name, round(row['per_gpu'] / 1e9, 1)))
        # what a config turns on to save memory, it needs: its step is over 80 GB without it
        kept = config_memory.memory_settings(cfg)
        assert bool(kept) == ('without' in row), name
        if kept:
            assert row['without']['per_gpu'] > limit, f'{name} fits without {row["without"]["settings"]}'
        # a config spread over more GPUs than its recipe's layout would not fit at the recipe's images per GPU
        if row['gpus'] and row['gpus'] != GPUS:
            assert row['at_recipe_layout']['per_gpu'] > limit, f'{name} fits at its recipe\'s {GPUS} GPUs'
    assert not over, f'over 80 GB per GPU: {over}'


def test_the_benchmarks_page_carries_the_generated_table(table):
    with open(osp.join(REPO, 'docs', 'benchmarks.md')) as f:
        page = f.read()
    assert config_memory.markdown_table(table['rows'].values()) in page
    assert f"measured {table['measured']}" in page


def test_the_per_gpu_steps_go_task_by_task_in_the_presets_order():
    """A time limit cuts ``--per-gpu-step`` short: every preset's Mask R-CNN comes first, in the order given."""
    presets = ['rmt_t', 'reswin_t']
    names = [n for n in config_memory.dense_configs() if config_memory.config_preset(n) in presets]
    ordered = sorted(names, key=lambda n: config_memory.step_order(n, presets))
    assert ordered[:4] == ['mask_rcnn_rmt_t_1x.py', 'mask_rcnn_rmt_t_3x.py', 'mask_rcnn_reswin_t_1x.py',
                           'mask_rcnn_reswin_t_3x.py']
    assert ordered[4:6] == ['upernet_rmt_t_160k_ade20k.py', 'upernet_reswin_t_160k_ade20k.py']
    assert sorted(ordered) == sorted(names)


def _recipe(name):
    cfg = Config.fromfile(osp.join(CONFIGS, name))
    return cfg, osp.join(CONFIGS, name)


def test_the_preflight_warns_when_a_run_asks_more_images_per_gpu_than_fit(table):
    """The recipe's own batch fits 80 GB; a batch the GPU cannot hold by the table's estimate gets a warning that
    names the estimate, its row and the fixes."""
    name = 'mask_rcnn_reswin_t_3x.py'
    cfg, path = _recipe(name)
    assert memory.check_gpu_memory(cfg, path) == []
    row = table['rows'][name]
    per_image = config_memory.per_gpu_bytes(row['step'], 2) - config_memory.per_gpu_bytes(row['step'], 1)
    cfg.train_dataloader.batch_size = int(80e9 / per_image) + 2
    warning, = memory.check_gpu_memory(cfg, path)
    estimate = config_memory.per_gpu_bytes(row['step'], cfg.train_dataloader.batch_size)
    assert f'about {estimate / 1e9:.1f} GB per GPU at {cfg.train_dataloader.batch_size} images per GPU' in warning
    assert f'row {name}' in warning and 'no GPU is visible here: assumed 80 GB' in warning
    assert 'model.backbone.with_cp=True' in warning and '--auto-scale-lr' in warning
    fits = int((80e9 - config_memory.per_gpu_bytes(row['step'], 0)) // per_image)
    assert f'or train {fits} images per GPU on more GPUs (--cfg-options train_dataloader.batch_size={fits}' in warning
    assert config_memory.per_gpu_bytes(row['step'], fits) <= 80e9 < config_memory.per_gpu_bytes(row['step'], fits + 1)


def test_a_config_that_inherits_a_row_is_estimated_from_it_at_its_own_size(tmp_path, table):
    name = 'mask_rcnn_reswin_t_1x.py'
    mine = tmp_path / 'my_detector.py'
    mine.write_text(f"_base_ = [{osp.join(CONFIGS, name)!r}]\ntrain_dataloader = dict(batch_size=64)\n")
    cfg = Config.fromfile(str(mine))
    warning, = memory.check_gpu_memory(cfg, str(mine))
    assert f'row {name} (inherited)' in warning
    # the same run at a quarter of the pixels: its activations scaled by the pixels
    cfg.train_dataloader.dataset.pipeline[2].scale = (666, 400)
    estimate, shape, _ = memory.estimate_per_gpu(cfg, table['rows'][name])
    assert shape == (400, 666)
    step = table['rows'][name]['step']
    full = config_memory.per_gpu_bytes(step, 64)
    fixed = config_memory.per_gpu_bytes(step, 0)
    assert abs((estimate - fixed) / (full - fixed) - 400 * 666 / (800 * 1333)) < 1e-6


def _logged(monkeypatch):
    import mmengine.logging
    logged, print_log = [], mmengine.logging.print_log
    monkeypatch.setattr(mmengine.logging, 'print_log', lambda msg, *a, **k: logged.append(str(msg)) or print_log(
        msg, *a, **k))
    return logged


@pytest.mark.parametrize('change,named', [
    ('backbone=dict(with_cp=True)', 'model.backbone.with_cp = True (its row: default)'),
    ("backbone=dict(window_size=8)", 'model.backbone.window_size = 8 (its row: default)')])
def test_a_run_that_changes_its_rows_model_says_what_it_assumed(tmp_path, monkeypatch, change, named):
    """Activation checkpointing (the warning's own first fix) or another window makes a model no row measured: the
    estimate is the inherited row's, and the log and the warning say so, what changed and how to measure it."""
    mine = tmp_path / 'mine.py'
    mine.write_text(f"_base_ = [{osp.join(CONFIGS, 'mask_rcnn_reswin_t_1x.py')!r}]\nmodel = dict({change})\n"
                    'train_dataloader = dict(batch_size=64)\n')
    logged = _logged(monkeypatch)
    warning, = memory.check_gpu_memory(Config.fromfile(str(mine)), str(mine))
    note, = [m for m in logged if m.startswith('GPU memory')]
    measure = f'python tools/analysis/config_memory.py {mine}'
    assert 'no row of the measured table' in note and named in note and measure in note, note
    assert 'row mask_rcnn_reswin_t_1x.py (inherited)' in warning and 'assumes the model of that row' in warning
    assert named in warning and measure in warning


def test_a_run_that_sets_another_presets_arch_is_estimated_from_that_presets_row(tmp_path, table, monkeypatch):
    """The ReSwin-T detector with ReSwin-B's backbone and neck is ReSwin-B's detector: its row, not ReSwin-T's."""
    mine = tmp_path / 'mine.py'
    b = Config.fromfile(osp.join(CONFIGS, 'mask_rcnn_reswin_b_1x.py')).model
    mine.write_text(f"_base_ = [{osp.join(CONFIGS, 'mask_rcnn_reswin_t_1x.py')!r}]\n"
                    f"model = dict(backbone=dict(_delete_=True, **{b.backbone.to_dict()!r}), "
                    f"neck=dict(in_channels={list(b.neck.in_channels)}))\ntrain_dataloader = dict(batch_size=16)\n")
    cfg = Config.fromfile(str(mine))
    row, step = memory.find_row(cfg, str(mine), table['rows'])
    assert row['config'] == 'mask_rcnn_reswin_b_1x.py' and step is row['step']
    logged = _logged(monkeypatch)
    warning, = memory.check_gpu_memory(cfg, str(mine))
    assert 'row mask_rcnn_reswin_b_1x.py (the same model)' in warning and not logged[:-1]
    assert f"about {memory.per_gpu_bytes(row['step'], 16) / 1e9:.1f} GB per GPU" in warning


def test_an_amp_row_bounds_a_float32_run_at_twice_its_activations(table, monkeypatch):
    """On a GPU, a run of an AMP recipe turned to float32 is estimated from the AMP row with its activations
    doubled; with no GPU visible, in the recipe's precision (the CPU's float32 fall-back is no GPU run)."""
    name = 'mask_rcnn_reswin_t_1x.py'
    cfg, path = _recipe(name)
    row = table['rows'][name]
    assert row['dtype'] == 'fp16' == memory.amp_dtype(cfg)
    amp, _, _ = memory.estimate_per_gpu(cfg, row, dtype='fp16')
    full, _, step = memory.estimate_per_gpu(cfg, row, dtype='float32')
    fixed = config_memory.per_gpu_bytes(row['step'], 0) - row['step']['weight_copies']
    assert full - fixed == pytest.approx(2 * (amp - fixed - row['step']['weight_copies']), rel=1e-6)
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(memory, 'visible_gpu_memory', lambda: ((amp + full) / 2, 'a test GPU'))
    cfg.optim_wrapper.type = 'OptimWrapper'
    warning, = memory.check_gpu_memory(cfg, path)
    assert 'in float32, from the row\'s AMP step' in warning and '--amp' in warning
    cfg.optim_wrapper.type = 'AmpOptimWrapper'
    assert memory.check_gpu_memory(cfg, path) == []


def test_train_runs_the_memory_check_in_its_preflight(monkeypatch):
    """``tools/train.py``'s pre-flight logs the warning (here with a GPU too small for the weights alone)."""
    import mmengine.logging
    from mmvisatt.engine.entrypoints import prepare_train
    monkeypatch.setattr(memory, 'visible_gpu_memory', lambda: (0.5e9, 'a 0.5 GB test GPU'))
    logged, print_log = [], mmengine.logging.print_log
    monkeypatch.setattr(mmengine.logging, 'print_log', lambda msg, *a, **k: logged.append(str(msg)) or print_log(
        msg, *a, **k))
    prepare_train([osp.join(CONFIGS, 'mask_rcnn_reswin_t_1x.py'), '--demo'])
    assert any('more than the 0.5 GB of the GPU (a 0.5 GB test GPU)' in message for message in logged), logged


def test_a_pipeline_the_walker_cannot_read_is_estimated_at_the_rows_size(table):
    name = 'mask_rcnn_reswin_t_1x.py'
    cfg, _ = _recipe(name)
    cfg.train_dataloader.dataset.pipeline[2] = dict(type='Resize', scale='as large as it gets')
    _, shape, _ = memory.estimate_per_gpu(cfg, table['rows'][name])
    assert shape == tuple(table['rows'][name]['shape'])


def test_the_memory_figures_written_in_the_prose_are_rows_of_the_table(table):
    """The sentences of docs/benchmarks.md's memory section state figures of docs/config_memory.json (per-GPU bytes
    of rows, of rows without their memory settings or at their recipe's layout, the directly measured batch): a
    figure the table does not hold fails, so the prose cannot drift from a re-measured table."""
    with open(osp.join(REPO, 'docs', 'benchmarks.md')) as f:
        page = f.read()
    section = page.split('## Memory per GPU', 1)[1].split('\n## ', 1)[0]
    prose = re.sub(r'<!-- (config-memory|calibration): begin -->.*?<!-- \1: end -->', '', section, flags=re.S)
    rows = table['rows'].values()
    held, checks = set(), [r['check'] for r in rows if 'check' in r]
    for row in rows:
        for part in (row, row.get('without') or {}, row.get('at_recipe_layout') or {}):
            if 'per_gpu' in part:
                held.add(f"{part['per_gpu'] / 1e9:.1f}")
    for check in checks:
        held |= {f"{check['measured'] / 1e9:.1f}", f"{check['formula'] / 1e9:.1f}",
                 f"{(check['formula'] - check['measured']) / 1e9:.1f}"}
    stated = [n for group in re.findall(r'((?:\d+\.\d+(?:, | and |-))*\d+\.\d+)\s+GB\b', prose)
              for n in re.findall(r'\d+\.\d+', group)]
    assert len(stated) > 20, stated
    assert set(stated) <= held, sorted(set(stated) - held)
    amp = sum(bool(r['amp']) for r in rows)
    assert f'Every dense config ({len(table["rows"])}:' in prose
    assert f'fp16 AMP for\n{amp} configs' in prose or f'fp16 AMP for {amp} configs' in prose
    assert f'float32 for {len(table["rows"]) - amp}' in prose
    for check in checks:
        assert f"{check['formula'] / check['measured']:.2f} times it" in prose
