"""What every dense config needs per GPU (tools/analysis/config_memory.py, docs/benchmarks.md): the counter, the
training sizes, the meta-device backbone against the whole step on the CPU, and the generated table: a row for
every dense config at its current model and batch, none over 80 GB."""
import json
import os.path as osp

import pytest
import torch
from mmengine.config import Config

from conftest import CONFIGS, REPO
from mmvisatt.testing.device_audit import LiveBytes

import config_memory  # noqa: E402  (tools/analysis, on sys.path through conftest)

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
    ('mask_rcnn_reswin_t_1x.py', (800, 1333)), ('mask_rcnn_reswin_t_3x.py', (800, 1333)),
    ('retinanet_rmt_t_1x.py', (800, 1333)), ('upernet_rmt_t_160k_ade20k.py', (512, 512)),
    ('fpn_shunted_t_80k_ade20k.py', (512, 512)), ('segformer_fan_hybrid_t_160k_cityscapes.py', (1024, 1024))])
def test_the_training_size_is_the_largest_the_pipeline_makes(config, size):
    assert config_memory.training_size(Config.fromfile(osp.join(CONFIGS, config))) == size


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
    over = []
    for name, row in rows.items():
        cfg = Config.fromfile(osp.join(CONFIGS, name))
        assert row['batch_per_gpu'] == cfg.train_dataloader.batch_size, name
        assert tuple(row['shape']) == config_memory.training_size(cfg), name
        assert row['key'] == config_memory.model_key(cfg, tuple(row['shape']), row['dtype']), \
            f'{name}: the model changed since its row was measured; run tools/analysis/config_memory.py {name}'
        assert row['per_gpu'] == config_memory.per_gpu_bytes(row['step'], row['batch_per_gpu'])
        if row['per_gpu'] > config_memory.LIMIT_GB * config_memory.GB:
            over.append((name, round(row['per_gpu'] / 1e9, 1)))
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
