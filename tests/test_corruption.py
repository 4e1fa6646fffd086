"""Corruption robustness: the 15 ImageNet-C corruptions as a pipeline transform, the COCO-C summary (mPC, rPC)
and the benchmark end to end on the demo data."""
import copy
import json
import math
import os.path as osp

import numpy as np
import pytest
import torch
from mmengine.config import Config
from mmengine.registry import TRANSFORMS

from conftest import CONFIGS

from mmvisatt.robustness import (CORRUPTION_GROUPS, CORRUPTIONS, SEVERITIES, CorruptImage,  # noqa: E402
                                 corrupt_image, image_seed, insert_corruption, markdown_table, select_metrics,
                                 summarize)
from mmvisatt.robustness.benchmark import (main, parse_args, resolve_corruptions,  # noqa: E402
                                           resolve_severities, write_reports)

ALL_15 = ('gaussian_noise', 'shot_noise', 'impulse_noise', 'defocus_blur', 'glass_blur', 'motion_blur', 'zoom_blur',
          'snow', 'frost', 'fog', 'brightness', 'contrast', 'elastic_transform', 'pixelate', 'jpeg_compression')


@pytest.fixture(scope='module')
def image() -> np.ndarray:
    """A small textured BGR image: gradients (for blurs and zoom), noise (for pixelate and JPEG), a square."""
    rng = np.random.default_rng(0)
    h, w = 48, 64
    yy, xx = np.mgrid[0:h, 0:w]
    img = np.stack([xx * 4, yy * 5, (xx + yy) * 2], axis=-1).astype(np.float64)
    img += rng.normal(0, 20, size=img.shape)
    img[12:30, 20:40] = (30, 200, 90)
    return np.clip(img, 0, 255).astype(np.uint8)


def test_the_fifteen_benchmark_corruptions():
    assert CORRUPTIONS == ALL_15
    assert sum(len(g) for g in CORRUPTION_GROUPS.values()) == 15 and SEVERITIES == (1, 2, 3, 4, 5)


@pytest.mark.parametrize('severity', [1, 5])
@pytest.mark.parametrize('corruption', ALL_15)
def test_corruption_runs_keeps_shape_changes_image_and_is_seeded(image, corruption, severity):
    state = np.random.get_state()
    out = corrupt_image(image, corruption, severity, seed=7)
    assert out.shape == image.shape and out.dtype == np.uint8
    assert np.abs(out.astype(int) - image.astype(int)).mean() > 0.5, 'the corruption left the image nearly as it was'
    np.testing.assert_array_equal(out, corrupt_image(image, corruption, severity, seed=7))
    # numpy's global generator, which the library draws from, is left as it was
    assert all(np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b
               for a, b in zip(state, np.random.get_state()))


def test_severity_orders_the_damage(image):
    errors = [np.abs(corrupt_image(image, 'gaussian_noise', s, seed=0).astype(int) - image).mean() for s in SEVERITIES]
    assert errors == sorted(errors) and errors[-1] > 2 * errors[0]


def test_seed_changes_random_corruptions(image):
    for corruption in ('gaussian_noise', 'impulse_noise', 'glass_blur', 'frost', 'fog'):
        a = corrupt_image(image, corruption, 3, seed=1)
        b = corrupt_image(image, corruption, 3, seed=2)
        assert not np.array_equal(a, b), corruption


def test_channel_order_is_respected(image):
    """The corruptions are defined on RGB: a BGR image is corrupted as its RGB view would be."""
    rgb = np.ascontiguousarray(image[..., ::-1])
    for corruption in ('frost', 'brightness', 'snow'):
        from_bgr = corrupt_image(image, corruption, 4, seed=3, channel_order='bgr')
        from_rgb = corrupt_image(rgb, corruption, 4, seed=3, channel_order='rgb')
        np.testing.assert_array_equal(from_bgr, from_rgb[..., ::-1])
    assert not np.array_equal(corrupt_image(image, 'frost', 4, seed=3, channel_order='rgb'),
                              corrupt_image(image, 'frost', 4, seed=3, channel_order='bgr'))


def test_float_images_keep_their_dtype(image):
    out = corrupt_image(image.astype(np.float32), 'contrast', 2, seed=0)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, corrupt_image(image, 'contrast', 2, seed=0).astype(np.float32))


@pytest.mark.parametrize('kwargs, message', [
    (dict(corruption='smoke', severity=1), "unknown corruption 'smoke'; choose from gaussian_noise"),
    (dict(corruption='fog', severity=0), 'severity must be an integer from 1 to 5'),
    (dict(corruption='fog', severity=6), 'severity must be an integer from 1 to 5'),
    (dict(corruption='fog', severity=2.0), 'severity must be an integer from 1 to 5'),
    (dict(corruption='fog', severity=1, channel_order='hsv'), "channel_order must be 'bgr' or 'rgb'"),
])
def test_bad_arguments_say_what_is_allowed(image, kwargs, message):
    with pytest.raises(ValueError, match=message):
        corrupt_image(image, **kwargs)
    kwargs.pop('seed', None)
    with pytest.raises(ValueError, match=message):
        CorruptImage(**kwargs)


def test_bad_images_say_what_is_expected(image):
    with pytest.raises(ValueError, match=r"\(H, W, 3\) image.*color_type='color'"):
        corrupt_image(image[..., 0], 'fog', 1)
    with pytest.raises(ValueError, match='at least 32x32'):
        corrupt_image(image[:20], 'fog', 1)
    with pytest.raises(ValueError, match='uint8 or float'):
        corrupt_image(image.astype(np.int32), 'fog', 1)


def test_transform_builds_in_every_scope_and_seeds_by_file_name(image):
    import mmdet.registry
    import mmseg.registry
    for registry in (TRANSFORMS, mmdet.registry.TRANSFORMS, mmseg.registry.TRANSFORMS):
        assert registry.get('CorruptImage') is CorruptImage
    transform = TRANSFORMS.build(dict(type='CorruptImage', corruption='shot_noise', severity=2, seed=5))
    first = transform(dict(img=image.copy(), img_path='/data/a/0001.jpg'))['img']
    moved = transform(dict(img=image.copy(), img_path='/elsewhere/0001.jpg'))['img']
    other = transform(dict(img=image.copy(), img_path='/data/a/0002.jpg'))['img']
    np.testing.assert_array_equal(first, moved)
    assert not np.array_equal(first, other)
    np.testing.assert_array_equal(first, corrupt_image(image, 'shot_noise', 2, seed=image_seed(5, '0001.jpg')))
    assert 'shot_noise' in repr(transform)
    with pytest.raises(KeyError, match='after LoadImageFromFile'):
        transform(dict(img_path='x.jpg'))


def _test_cfg(dataset: dict) -> Config:
    return Config(dict(test_dataloader=dict(batch_size=1, dataset=dataset)))


def test_insert_corruption_after_loading():
    load = dict(type='LoadImageFromFile')
    pipeline = [load, dict(type='Resize', scale=(8, 8)), dict(type='PackDetInputs')]
    cfg = _test_cfg(dict(type='CocoDataset', pipeline=pipeline))
    assert insert_corruption(cfg, 'fog', 3, seed=1) == 1
    pipeline = cfg.test_dataloader.dataset.pipeline
    assert [step['type'] for step in pipeline] == ['LoadImageFromFile', 'CorruptImage', 'Resize', 'PackDetInputs']
    assert pipeline[1] == dict(type='CorruptImage', corruption='fog', severity=3, seed=1)
    assert 'mmvisatt.robustness' in cfg.custom_imports['imports']
    with pytest.raises(ValueError, match='already has a CorruptImage'):
        insert_corruption(cfg, 'fog', 3)

    wrapped = _test_cfg(dict(type='ConcatDataset', datasets=[
        dict(type='A', pipeline=[dict(type='mmdet.LoadImageFromFile'), dict(type='PackDetInputs')]),
        dict(type='RepeatDataset', dataset=dict(type='B', pipeline=[load, dict(type='PackSegInputs')]))]))
    assert insert_corruption(wrapped, 'pixelate', 5) == 2

    with pytest.raises(ValueError, match='no LoadImageFromFile found in test_dataloader.dataset.pipeline'):
        insert_corruption(_test_cfg(dict(type='A', pipeline=[dict(type='LoadImageFromNDArray')])), 'fog', 1)
    with pytest.raises(ValueError, match="already has a Corrupt transform"):
        insert_corruption(_test_cfg(dict(type='A', pipeline=[load, dict(type='Corrupt', corruption='fog')])),
                          'fog', 1)


def test_segmentation_demo_pipeline_gets_corrupted_images(tmp_path, monkeypatch):
    """The test set of an mmseg config, prepared as tools/test.py --demo prepares it, yields corrupted inputs."""
    from mmengine.registry import DefaultScope
    from mmseg.registry import DATASETS

    from mmvisatt.engine import prepare_test

    monkeypatch.chdir(tmp_path)
    torch.save({}, tmp_path / 'model.pth')
    cfg, _ = prepare_test([osp.join(CONFIGS, 'upernet_reswin_t_160k_ade20k.py'), 'model.pth', '--demo'])
    insert_corruption(corrupted_cfg := copy.deepcopy(cfg), 'jpeg_compression', 5)
    with DefaultScope.overwrite_default_scope('mmseg'):
        clean = DATASETS.build(cfg.test_dataloader.dataset)[0]
        corrupted = DATASETS.build(corrupted_cfg.test_dataloader.dataset)[0]
    assert corrupted['inputs'].shape == clean['inputs'].shape
    assert (corrupted['inputs'].float() - clean['inputs'].float()).abs().mean() > 1
    # the labels are those of the clean image
    assert (corrupted['data_samples'].gt_sem_seg.data == clean['data_samples'].gt_sem_seg.data).all()


def test_summary_follows_the_coco_c_formulas():
    clean = {'bbox': 0.40, 'segm': 0.0}
    corrupted = {
        'fog': {1: {'bbox': 0.30, 'segm': 0.2}, 3: {'bbox': 0.20, 'segm': 0.1}},
        'gaussian_noise': {1: {'bbox': 0.10, 'segm': 0.0}},
    }
    summary = summarize(clean, corrupted, ['bbox', 'segm'])
    assert summary['per_corruption']['fog']['bbox'] == pytest.approx(0.25)
    assert summary['per_corruption']['gaussian_noise']['bbox'] == pytest.approx(0.10)
    # mPC = 1/Nc sum_c 1/Ns sum_s P_cs: the mean of the per-corruption means (0.175), not of all runs (0.2)
    assert summary['mPC']['bbox'] == pytest.approx((0.25 + 0.10) / 2)
    assert summary['rPC']['bbox'] == pytest.approx(0.175 / 0.40)
    assert summary['mPC']['segm'] == pytest.approx((0.15 + 0.0) / 2)
    assert summary['rPC']['segm'] is None  # undefined for a clean score of 0
    assert summary['clean'] == clean and summary['corrupted']['fog'][3] == {'bbox': 0.20, 'segm': 0.1}
    with pytest.raises(ValueError, match='no corrupted results'):
        summarize(clean, {}, ['bbox'])


def test_full_grid_mpc_is_the_mean_of_all_runs():
    rng = np.random.default_rng(1)
    values = rng.random((15, 5))
    corrupted = {c: {s: {'mIoU': values[i, s - 1]} for s in SEVERITIES} for i, c in enumerate(CORRUPTIONS)}
    summary = summarize({'mIoU': 2.0}, corrupted, ['mIoU'])
    assert summary['mPC']['mIoU'] == pytest.approx(values.mean())
    assert summary['rPC']['mIoU'] == pytest.approx(values.mean() / 2.0)


def test_reports(tmp_path):
    summary = summarize({'coco/bbox_mAP': 0.5}, {'fog': {1: {'coco/bbox_mAP': 0.4}, 5: {'coco/bbox_mAP': 0.2}},
                                                 'snow': {1: {'coco/bbox_mAP': float('nan')}}},
                        ['coco/bbox_mAP'])
    table = markdown_table(summary)
    assert '| fog | weather | 0.400 | 0.200 | 0.300 |' in table and '| snow | weather | n/a |  | n/a |' in table
    paths = write_reports(dict(summary, config='configs/x.py'), str(tmp_path))
    with open(paths['json']) as f:
        saved = json.load(f)
    assert saved['mPC']['coco/bbox_mAP'] is None and saved['corrupted']['fog']['5'] == {'coco/bbox_mAP': 0.2}
    with open(paths['png'], 'rb') as f:
        assert f.read(8) == b'\x89PNG\r\n\x1a\n'
    with open(paths['md']) as f:
        assert f.read().startswith('# Corruption benchmark: x.py')


def test_metric_selection():
    det = {'coco/bbox_mAP': 0.1, 'coco/bbox_mAP_50': 0.2, 'coco/segm_mAP': 0.05, 'coco/segm_mAP_l': -1.0}
    assert select_metrics(det) == ['coco/bbox_mAP', 'coco/segm_mAP']
    assert select_metrics({'aAcc': 80.0, 'mIoU': 40.0, 'mAcc': 50.0}) == ['mIoU']
    assert select_metrics(det, ['coco/bbox_mAP_50']) == ['coco/bbox_mAP_50']
    with pytest.raises(ValueError, match='--metrics mAP: not computed.*available: coco/bbox_mAP'):
        select_metrics(det, ['mAP'])
    with pytest.raises(ValueError, match='name the ones to summarise with --metrics'):
        select_metrics({'accuracy/top1': 70.0})


def test_corruption_and_severity_choices(capsys):
    assert resolve_corruptions(None) == list(CORRUPTIONS) == resolve_corruptions(['all'])
    assert resolve_corruptions(['fog', 'noise', 'fog']) == ['fog', 'gaussian_noise', 'shot_noise', 'impulse_noise']
    assert resolve_severities([5, 1, 5]) == [1, 5] and resolve_severities(None) == [1, 2, 3, 4, 5]
    with pytest.raises(SystemExit):
        parse_args(['c.py', 'k.pth', '--corruptions', 'smoke'])
    assert "unknown corruption 'smoke'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(['c.py', 'k.pth', '--severities', '6'])
    assert 'invalid choice: 6' in capsys.readouterr().err


@pytest.mark.slow
def test_benchmark_end_to_end_on_demo_data(tiny_det_config, tmp_path, monkeypatch):
    """A 5-iteration tiny Mask R-CNN, benchmarked on 8 demo images under 2 corruptions at severity 5.

    Its COCO scores are near zero and reported to 3 decimals, so a single mAP can coincide between clean and
    corrupted runs; the full set of bbox/segm/proposal metrics of a corrupted run cannot, unless the corruption
    never reached the model."""
    from mmvisatt.engine.entrypoints import train_main

    monkeypatch.chdir(tmp_path)
    train_dir, out_dir = tmp_path / 'train', tmp_path / 'bench'
    train_main([tiny_det_config, '--demo', '--work-dir', str(train_dir), '--cfg-options', 'train_cfg.max_iters=5',
                'val_dataloader=None', 'val_cfg=None', 'val_evaluator=None'])
    checkpoint = train_dir / 'iter_5.pth'
    # fewer test images, proposals and detections: the untrained mask head runs on every detection
    options = ['test_dataloader.dataset.indices=8', 'model.test_cfg.rpn.max_per_img=50',
               'model.test_cfg.rcnn.max_per_img=8', 'test_evaluator.metric=[bbox,segm,proposal]']
    summary = main([tiny_det_config, str(checkpoint), '--demo', '--corruptions', 'contrast', 'gaussian_noise',
                    '--severities', '5', '--metrics', 'coco/bbox_mAP', 'coco/segm_mAP', 'coco/AR@100',
                    '--out-dir', str(out_dir), '--cfg-options', *options])

    metrics = ['coco/bbox_mAP', 'coco/segm_mAP', 'coco/AR@100']
    assert summary['metrics'] == metrics and list(summary['corrupted']) == ['contrast', 'gaussian_noise']
    for metric in metrics:
        values = [summary['clean'][metric], summary['mPC'][metric]] + \
            [summary['corrupted'][c][5][metric] for c in summary['corrupted']]
        assert all(math.isfinite(v) and 0 <= v <= 1 for v in values), (metric, values)
        expected = (summary['corrupted']['contrast'][5][metric] + summary['corrupted']['gaussian_noise'][5][metric]) / 2
        assert summary['mPC'][metric] == pytest.approx(expected)
        clean = summary['clean'][metric]
        assert summary['rPC'][metric] == (pytest.approx(expected / clean) if clean else None)
    raw = summary['raw']
    assert set(raw) == {'clean', 'contrast_5', 'gaussian_noise_5'}
    for name in ('contrast_5', 'gaussian_noise_5'):
        assert raw[name] != raw['clean'], f'{name}: every metric equals the clean run: the images were not corrupted'

    for path in (out_dir / 'corruption_benchmark.json', out_dir / 'corruption_benchmark.md',
                 out_dir / 'corruption_benchmark.png'):
        assert path.is_file() and path.stat().st_size > 0
    with open(out_dir / 'corruption_benchmark.json') as f:
        assert json.load(f)['corrupted']['contrast']['5']['coco/AR@100'] == raw['contrast_5']['coco/AR@100']

    # the config the Runner saved for a corrupted run has the transform right after loading
    saved, = (out_dir / 'runs' / 'contrast_5').glob('*.py')
    pipeline = Config.fromfile(str(saved)).test_dataloader.dataset.pipeline
    assert pipeline[1] == dict(type='CorruptImage', corruption='contrast', severity=5, seed=0)

    # a second benchmark with the same settings reuses the runs instead of evaluating again
    again = main([tiny_det_config, str(checkpoint), '--demo', '--corruptions', 'contrast', '--severities', '5',
                  '--metrics', *metrics, '--out-dir', str(out_dir), '--cfg-options', *options])
    assert again['raw'] == {k: raw[k] for k in ('clean', 'contrast_5')}
    assert len(list((out_dir / 'runs' / 'clean').glob('2*'))) == 1  # one timestamped log dir: one Runner
