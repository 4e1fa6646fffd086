"""tools/analysis/plot_logs.py and mmvisatt.analysis.logs: mmengine's scalar logs of a work dir become training and
validation curves."""
import json
import os.path as osp
import re

import pytest
from matplotlib.image import imread

from mmvisatt.analysis.logs import (LogError, default_keys, find_scalar_files, load_training_log, plot_logs_main,
                                    plot_training_log, run_plot_logs, select_keys)


def _write_run(work_dir, stamp: str, records, name: str = 'scalars.json', tail: str = '') -> str:
    path = work_dir / stamp / 'vis_data' / name
    path.parent.mkdir(parents=True)
    path.write_text(''.join(json.dumps(r) + '\n' for r in records) + tail)
    return str(path)


def _train(i: int, loss: float) -> dict:
    return {'lr': 1e-4, 'loss': loss, 'loss_cls': loss / 2, 'time': 0.5, 'iter': i, 'step': i}


def _val(step: int, map_: float) -> dict:
    return {'coco/bbox_mAP': map_, 'coco/bbox_mAP_l': -1.0, 'data_time': 0.01, 'time': 0.2, 'step': step}


@pytest.fixture
def resumed_work_dir(tmp_path):
    """A run validating at 0 and 4 with ``step`` = epoch = 0 (mmengine's default in an iteration-based run), killed
    while writing after iteration 6, then resumed from iteration 4."""
    _write_run(tmp_path, '20260101_000000',
               [_val(0, 0.0)] + [_train(i, 5.0 - i * 0.25) for i in (2, 4)] + [_val(0, 0.125), _train(6, 3.5)],
               tail='{"lr": 1e-4, "lo')
    _write_run(tmp_path, '20260101_010000', [_train(i, 4.0 - i * 0.25) for i in (5, 6, 8)] + [_val(0, 0.25)],
               name='20260101_010000.json')
    (tmp_path / '20260101_020000' / 'vis_data').mkdir(parents=True)  # a test run: no scalars
    return tmp_path


def test_reads_runs_in_order_and_places_validations(resumed_work_dir):
    with pytest.warns(UserWarning, match='truncated last line'):
        log = load_training_log(str(resumed_work_dir))
    assert [osp.basename(s) for s in log.sources] == ['scalars.json', '20260101_010000.json']
    # the resumed run redid iteration 6: its value replaces the first run's
    assert log.train['loss'] == [(2, 4.5), (4, 4.0), (5, 2.75), (6, 2.5), (8, 2.0)]
    assert log.val['coco/bbox_mAP'] == [(0, 0.0), (4, 0.125), (8, 0.25)]
    assert default_keys(log) == (['loss', 'loss_cls'], ['coco/bbox_mAP'])  # -1 throughout: not measured


def test_validation_step_in_iterations(tmp_path):
    """LoggerHook(log_metric_by_epoch=False) logs validations at their iteration: that iteration is kept."""
    _write_run(tmp_path, '20260101_000000', [_train(10, 1.0), _val(16, 0.5)])
    assert load_training_log(str(tmp_path)).val['coco/bbox_mAP'] == [(16, 0.5)]


def test_key_selection(resumed_work_dir):
    with pytest.warns(UserWarning):
        log = load_training_log(str(resumed_work_dir / '20260101_000000'))
    assert select_keys(log, ['bbox_mAP', 'loss_*']) == (['loss_cls'], ['coco/bbox_mAP'])
    assert select_keys(log, ['time', 'lr']) == (['time', 'lr'], ['time'])
    with pytest.raises(LogError, match="key 'bbox_mAR' is not in the logs; training keys: lr, loss"):
        select_keys(log, ['bbox_mAR'])


def test_plot_writes_png(resumed_work_dir, tmp_path):
    with pytest.warns(UserWarning):
        log = load_training_log(str(resumed_work_dir))
    path = plot_training_log(log, str(tmp_path / 'out' / 'curves.png'), keys=['loss', 'lr', 'bbox_mAP'])
    pixels = imread(path)
    assert pixels.shape[0] > pixels.shape[1] > 400  # three panels stacked
    assert pixels[..., :3].std() > 0.05


def test_missing_or_empty_work_dir(tmp_path, capsys):
    with pytest.raises(FileNotFoundError, match='work dir not found'):
        find_scalar_files(str(tmp_path / 'nowhere'))
    with pytest.raises(LogError, match=r'<timestamp>/vis_data/scalars.json'):
        find_scalar_files(str(tmp_path))
    (tmp_path / '20260101_000000' / 'vis_data').mkdir(parents=True)
    with pytest.raises(LogError, match='nothing logged yet'):
        find_scalar_files(str(tmp_path))
    with pytest.raises(SystemExit, match='error: work dir not found'):
        run_plot_logs([str(tmp_path / 'nowhere')])
    bad = _write_run(tmp_path, '20260102_000000', [_train(1, 1.0)], tail='oops\n' + json.dumps(_train(2, 1.0)))
    with pytest.raises(LogError, match=re.escape(f'{bad}:2 is not a JSON object')):
        load_training_log(str(tmp_path))


@pytest.mark.slow
def test_plot_demo_run(demo_det_run, tmp_path, capsys):
    out = str(tmp_path / 'plot.png')
    assert plot_logs_main([demo_det_run, '--keys', 'loss', 'bbox_mAP', 'segm_mAP', '--out', out]) == out
    assert imread(out).shape[0] > 300
    printed = capsys.readouterr().out
    for expected in ('training   loss: 3 points', 'validation coco/bbox_mAP: 2 points', f'wrote {out}'):
        assert expected in printed, printed
    log = load_training_log(demo_det_run)
    assert [i for i, _ in log.train['loss']] == [1, 2, 3]
    assert [i for i, _ in log.val['coco/segm_mAP']] == [0, 3]
    assert {'loss_rpn_cls', 'loss_mask', 'coco/bbox_mAP'} <= set(default_keys(log)[0] + default_keys(log)[1])
    assert osp.isfile(plot_logs_main([demo_det_run]))  # default: WORK_DIR/training_curves.png


@pytest.mark.slow
def test_demo_writes_its_pictures(demo_det_run):
    """The demo's DemoReportHook: ground truth beside the prediction for each validation image the run has (two
    here), one row each, and the loss / mAP curves."""
    from mmvisatt.engine import DemoSettings
    size = DemoSettings().img_size
    pictures = imread(osp.join(demo_det_run, 'demo_predictions.png'))
    assert pictures.shape[:2] == (2 * size, 2 * size)
    # the ground-truth half has drawn boxes and masks on it: it differs from the plain image
    assert pictures[:size, :size].std() > 0 and not (pictures[:size, :size] == pictures[:size, size:]).all()
    assert imread(osp.join(demo_det_run, 'demo_curves.png')).shape[0] > 300


def test_demo_pictures_of_a_segmentor_show_ground_truth_and_prediction(tmp_path):
    """mmseg's visualizer keeps only the prediction half as its current image; the picture must have both."""
    from types import SimpleNamespace

    import numpy as np
    from mmengine.config import Config
    from mmengine.model import revert_sync_batchnorm
    from mmengine.registry import init_default_scope
    from mmseg.registry import DATASETS, MODELS, VISUALIZERS

    import mmvisatt.datasets.transforms  # noqa: F401  (LoadCheckedImageFromFile)
    import mmvisatt.models  # noqa: F401
    from conftest import CONFIGS
    from mmvisatt.engine import DemoSettings, to_demo_config
    from mmvisatt.engine.demo import DemoReportHook

    init_default_scope('mmseg')
    cfg = to_demo_config(Config.fromfile(osp.join(CONFIGS, 'fpn_reswin_t_80k_ade20k.py')), train=False)
    cfg.model.backbone.arch = dict(embed_dims=16, depths=(1, 1, 1, 1), num_heads=(1, 1, 2, 2))
    cfg.model.neck.in_channels = [16, 32, 64, 128]
    dataset = DATASETS.build(cfg.val_dataloader.dataset)
    visualizer = VISUALIZERS.build(dict(cfg.visualizer, name='seg_demo_pictures', save_dir=str(tmp_path)))
    model = revert_sync_batchnorm(MODELS.build(cfg.model))  # SyncBN has no CPU kernel
    runner = SimpleNamespace(val_loop=object(), val_dataloader=SimpleNamespace(dataset=dataset), model=model,
                             visualizer=visualizer, work_dir=str(tmp_path))
    path = DemoReportHook(num_images=2)._predictions(runner)
    size = DemoSettings().img_size
    pictures = imread(path)
    assert pictures.shape[:2] == (2 * size, 2 * size)
    # an untrained model's class map is not the ground truth's
    assert not np.array_equal(pictures[:size, :size], pictures[:size, size:])
