"""What every dense config needs per GPU (tools/analysis/config_memory.py, docs/benchmarks.md): the counter, the
training sizes, the meta-device backbone against the whole step on the CPU, and the generated table: a row for
every dense config at its current model and batch, none over 80 GB."""
import json
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


@pytest.mark.parametrize('name', ['mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py',
                                  'mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco.py'])
def test_the_estimate_holds_against_mmdets_published_swin_t_peak(name):
    """The table's method on mmdet's own float32 Swin-T Mask R-CNN configs (installed with mmdet): at or above
    the max_memory_allocated mmdet publishes for them (8 GPUs x 2 images; 1x 7.6 GB, multi-scale crop 3x 10.2 GB),
    and within 1.35 times it."""
    row, = config_memory.calibrate([name])
    assert not row['amp'] and row['batch_per_gpu'] == 2
    assert 1.0 <= row['ratio'] <= 1.35, row


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
    assert one == whole['fwd_bwd_peak'] + whole['grads'] + whole['optimizer_state']
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
    fixed = step['weights'] + step['grads'] + step['optimizer_state']
    assert abs((estimate - fixed) / (full - fixed) - 400 * 666 / (800 * 1333)) < 1e-6


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
