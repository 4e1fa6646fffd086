"""Tests of the synthetic demo datasets (mmvisatt.datasets)."""
from __future__ import annotations

import contextlib
import io
import json
import os
import os.path as osp
from pathlib import Path

import cv2
import numpy as np
import pytest

from mmvisatt.datasets import (DEMO_ADE_CLASSES, DEMO_COCO_CLASSES,
                               demo_data_root, prepare_demo_ade,
                               prepare_demo_coco)
from mmvisatt.datasets import demo

SMALL = dict(num_train=8, num_val=4, img_size=96, seed=3)


@pytest.fixture(scope='module')
def coco_root(tmp_path_factory) -> str:
    return prepare_demo_coco(str(tmp_path_factory.mktemp('c') / 'coco'),
                             **SMALL)


@pytest.fixture(scope='module')
def ade_root(tmp_path_factory) -> str:
    return prepare_demo_ade(str(tmp_path_factory.mktemp('a') / 'ade'),
                            **SMALL)


def _load(root: str, split: str) -> dict:
    with open(osp.join(root, 'annotations', f'instances_{split}.json')) as f:
        return json.load(f)


def _tree(root: str) -> dict:
    """Relative path -> bytes of every file below ``root``."""
    out = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            path = osp.join(dirpath, name)
            out[osp.relpath(path, root)] = Path(path).read_bytes()
    return out


def test_public_constants():
    assert DEMO_COCO_CLASSES == ('square', 'circle', 'triangle')
    assert DEMO_ADE_CLASSES == ('background', 'square', 'circle', 'triangle')


def test_demo_data_root(monkeypatch, tmp_path):
    monkeypatch.setenv('MMVISATT_DATA_CACHE', str(tmp_path))
    assert demo_data_root() == str(tmp_path)
    assert demo._default_root('coco', dict(demo._DEFAULTS)) == str(
        tmp_path / 'coco_v2')
    assert demo._default_root('ade', dict(demo._DEFAULTS)) == str(
        tmp_path / 'ade_v2')
    monkeypatch.delenv('MMVISATT_DATA_CACHE')
    assert demo_data_root() == osp.join(
        osp.expanduser('~'), '.cache', 'mmvisatt', 'demo')


def test_non_default_args_get_their_own_cache(monkeypatch, tmp_path):
    monkeypatch.setenv('MMVISATT_DATA_CACHE', str(tmp_path))
    a = prepare_demo_coco(num_train=2, num_val=1, img_size=64)
    b = prepare_demo_coco(num_train=2, num_val=1, img_size=64, seed=1)
    assert a != b
    assert osp.dirname(a) == str(tmp_path)
    assert osp.basename(a).startswith('coco_v2-')
    assert sorted(os.listdir(tmp_path)) == sorted(
        [osp.basename(a), osp.basename(b)])  # no temporary dirs left


def test_layout(coco_root, ade_root):
    for split, n in (('train', 8), ('val', 4)):
        assert sorted(os.listdir(osp.join(coco_root, split))) == [
            f'{i:06d}.png' for i in range(n)
        ]
    for folder, n in (('training', 8), ('validation', 4)):
        imgs = sorted(os.listdir(osp.join(ade_root, 'images', folder)))
        anns = sorted(os.listdir(osp.join(ade_root, 'annotations', folder)))
        assert imgs == [f'{i:06d}.jpg' for i in range(n)]
        assert anns == [f'{i:06d}.png' for i in range(n)]


def test_determinism(tmp_path, coco_root, ade_root):
    again = prepare_demo_coco(str(tmp_path / 'coco'), **SMALL)
    assert _tree(again) == _tree(coco_root)
    other = prepare_demo_coco(str(tmp_path / 'other'),
                              **dict(SMALL, seed=4))
    assert _load(other, 'train') != _load(coco_root, 'train')
    again = prepare_demo_ade(str(tmp_path / 'ade'), **SMALL)
    assert _tree(again) == _tree(ade_root)


def test_images_are_textured(coco_root):
    img = cv2.imread(osp.join(coco_root, 'train', '000000.png'),
                     cv2.IMREAD_UNCHANGED)
    assert img.shape == (96, 96, 3) and img.dtype == np.uint8
    assert len(np.unique(img.reshape(-1, 3), axis=0)) > 1000


def test_coco_annotations(coco_root):
    from pycocotools import mask as mask_utils
    from pycocotools.coco import COCO

    for split in ('train', 'val'):
        with contextlib.redirect_stdout(io.StringIO()):
            coco = COCO(osp.join(coco_root, 'annotations',
                                 f'instances_{split}.json'))
        assert [c['name'] for c in coco.loadCats(coco.getCatIds())
                ] == list(DEMO_COCO_CLASSES)
        assert coco.getCatIds() == [1, 2, 3]
        anns = coco.loadAnns(coco.getAnnIds())
        assert anns and min(a['id'] for a in anns) >= 1
        per_image = {i: 0 for i in coco.getImgIds()}
        for ann in anns:
            img = coco.imgs[ann['image_id']]
            per_image[ann['image_id']] += 1
            x, y, w, h = ann['bbox']
            assert 0 <= x and 0 <= y and w > 0 and h > 0
            assert x + w <= img['width'] and y + h <= img['height']
            assert ann['category_id'] in (1, 2, 3)
            assert ann['iscrowd'] == 0
            assert ann['area'] >= 30 and ann['area'] <= w * h
            assert ann['segmentation'] and all(
                len(p) >= 6 and len(p) % 2 == 0 for p in ann['segmentation'])
            rles = mask_utils.frPyObjects(ann['segmentation'], img['height'],
                                          img['width'])
            poly_area = float(mask_utils.area(mask_utils.merge(rles)))
            # Polygons run through boundary pixel centres, so they miss about
            # half a pixel all around the mask, and cut the corners of
            # staircase edges (curves) a little more.
            assert ann['area'] - 1.5 * (w + h) - 4 <= poly_area <= ann['area'] * 1.02
            # mmdet computes boxes from polygons in some transforms; they
            # must agree with the stored box to within a pixel.
            pts = np.concatenate(
                [np.reshape(p, (-1, 2)) for p in ann['segmentation']])
            assert np.allclose(pts.min(0), [x + 0.5, y + 0.5])
            assert np.allclose(pts.max(0), [x + w - 0.5, y + h - 0.5])
        assert all(1 <= n <= 4 for n in per_image.values())


def test_coco_masks_do_not_overlap(coco_root):
    from pycocotools.coco import COCO

    with contextlib.redirect_stdout(io.StringIO()):
        coco = COCO(osp.join(coco_root, 'annotations',
                             'instances_train.json'))
    overlapping_boxes = 0
    for img_id in coco.getImgIds():
        anns = coco.loadAnns(coco.getAnnIds(imgIds=[img_id]))
        masks = [coco.annToMask(a).astype(bool) for a in anns]
        for i in range(len(anns)):
            for j in range(i + 1, len(anns)):
                assert not (masks[i] & masks[j]).any()
                xi, yi, wi, hi = anns[i]['bbox']
                xj, yj, wj, hj = anns[j]['bbox']
                overlapping_boxes += (xi < xj + wj and xj < xi + wi
                                      and yi < yj + hj and yj < yi + hi)
    # Objects do overlap in the images, only their masks do not.
    assert overlapping_boxes > 0


def test_ground_truth_scores_perfect_map(coco_root):
    """Catches id conventions that break COCOeval (e.g. annotation id 0)."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO(osp.join(coco_root, 'annotations', 'instances_val.json'))
        dets = [
            dict(image_id=a['image_id'], category_id=a['category_id'],
                 bbox=a['bbox'], segmentation=a['segmentation'], score=1.0)
            for a in gt.loadAnns(gt.getAnnIds())
        ]
        for iou_type in ('bbox', 'segm'):
            ev = COCOeval(gt, gt.loadRes([dict(d) for d in dets]), iou_type)
            ev.evaluate()
            ev.accumulate()
            ev.summarize()
            # stats[1] is AP@0.5; AP@[.5:.95] would also be 1 but absent
            # area ranges make some entries -1.
            assert ev.stats[1] == pytest.approx(1.0)


def _scene(owner: np.ndarray, labels) -> demo._Scene:
    image = np.zeros(owner.shape + (3, ), np.uint8)
    return demo._Scene(image=image, owner=owner.astype(np.int16),
                       labels=list(labels))


def test_occlusion_and_tiny_parts():
    owner = np.full((64, 64), -1)
    owner[10:40, 10:40] = 0  # square
    owner[25:55, 25:55] = 1  # later object covering the square's corner
    owner[50:54, 2:6] = 2  # 16 px: too small to annotate
    owner[0:8, 60:64] = 3
    owner[0:8, 56:64] = 4  # covers object 3 completely
    found = demo._visible_instances(_scene(owner, [0, 1, 2, 2, 1]))
    assert [cls for cls, _, _ in found] == [0, 1, 1]
    square = found[0][1]
    assert square.sum() == 30 * 30 - 15 * 15
    assert not square[25:40, 25:40].any()
    assert not (found[0][1] & found[1][1]).any()


def test_rendered_scenes_are_consistent():
    for index in range(20):
        scene = demo._render_scene(demo._scene_rng(0, 'train', index), 128)
        assert 1 <= len(scene.labels) <= 4
        assert scene.owner.min() >= -1
        assert scene.owner.max() == len(scene.labels) - 1
        for j in range(len(scene.labels)):
            # Holes would make the COCO polygons cover other objects.
            assert not demo._has_hole(scene.owner == j)


def test_idempotent(tmp_path, monkeypatch):
    root = prepare_demo_coco(str(tmp_path / 'coco'), num_train=2, num_val=1,
                             img_size=64)
    files = [osp.join(root, demo._MARKER),
             osp.join(root, 'annotations', 'instances_train.json'),
             osp.join(root, 'train', '000000.png')]
    stamps = [os.stat(f).st_mtime_ns for f in files]

    def fail(*args, **kwargs):
        raise AssertionError('regenerated an existing set')

    monkeypatch.setattr(demo, '_write_coco', fail)
    assert prepare_demo_coco(str(tmp_path / 'coco'), num_train=2, num_val=1,
                             img_size=64) == root
    assert [os.stat(f).st_mtime_ns for f in files] == stamps
    with pytest.raises(ValueError, match='different demo dataset'):
        prepare_demo_coco(str(tmp_path / 'coco'), num_train=3, num_val=1,
                          img_size=64)


def test_interrupted_run_leaves_nothing(tmp_path, monkeypatch):

    def interrupted(out, params):
        Path(out, 'partial').write_text('x')
        raise KeyboardInterrupt

    monkeypatch.setattr(demo, '_write_ade', interrupted)
    with pytest.raises(KeyboardInterrupt):
        prepare_demo_ade(str(tmp_path / 'ade'), num_train=2, num_val=1,
                         img_size=64)
    assert os.listdir(tmp_path) == []


def test_losing_the_race_uses_the_winner(tmp_path, monkeypatch):
    target = str(tmp_path / 'coco')
    real_write = demo._write_coco

    def write_while_another_rank_finishes(out, params):
        # The other rank completes and renames first, while we are writing.
        monkeypatch.setattr(demo, '_write_coco', real_write)
        prepare_demo_coco(target, **params)
        real_write(out, params)

    monkeypatch.setattr(demo, '_write_coco',
                        write_while_another_rank_finishes)
    params = dict(num_train=2, num_val=1, img_size=64, seed=0)
    assert prepare_demo_coco(target, **params) == target
    assert os.listdir(tmp_path) == ['coco']  # our temporary dir is gone
    assert osp.isfile(osp.join(target, demo._MARKER))


def test_ade_maps(ade_root, coco_root):
    for folder, n in (('training', 8), ('validation', 4)):
        seen = set()
        for i in range(n):
            img = cv2.imread(
                osp.join(ade_root, 'images', folder, f'{i:06d}.jpg'))
            seg = cv2.imread(
                osp.join(ade_root, 'annotations', folder, f'{i:06d}.png'),
                cv2.IMREAD_UNCHANGED)
            assert img.shape == (96, 96, 3)
            assert seg.shape == (96, 96) and seg.dtype == np.uint8
            values = set(np.unique(seg).tolist())
            assert values <= {0, 1, 2, 3, 4}
            assert 0 not in values and 1 in values  # documented: no ignore
            seen |= values
        assert len(seen) >= 3
    # Same seed, same scene: COCO instance masks agree with the ADE labels.
    coco = _load(coco_root, 'val')
    seg = cv2.imread(osp.join(ade_root, 'annotations', 'validation',
                              '000000.png'), cv2.IMREAD_UNCHANGED)
    for ann in coco['annotations']:
        if ann['image_id'] == 0:
            x, y, w, h = ann['bbox']
            box = seg[y:y + h, x:x + w]
            assert (box == ann['category_id'] + 1).sum() >= ann['area']


def test_mmdet_coco_dataset(coco_root):
    from mmcv.transforms import LoadImageFromFile
    from mmdet.datasets import CocoDataset
    from mmdet.datasets.transforms import LoadAnnotations

    raw = _load(coco_root, 'train')
    ds = CocoDataset(
        data_root=coco_root,
        ann_file='annotations/instances_train.json',
        data_prefix=dict(img='train/'),
        metainfo=dict(classes=DEMO_COCO_CLASSES),
        pipeline=[
            LoadImageFromFile(),
            LoadAnnotations(with_bbox=True, with_mask=True)
        ])
    assert len(ds) == SMALL['num_train']
    assert sum(len(ds.get_data_info(i)['instances'])
               for i in range(len(ds))) == len(raw['annotations'])
    sample = ds[0]
    n = sum(a['image_id'] == 0 for a in raw['annotations'])
    assert sample['img'].shape == (96, 96, 3)
    assert len(sample['gt_bboxes']) == n
    assert sample['gt_masks'].to_ndarray().shape == (n, 96, 96)
    assert set(sample['gt_bboxes_labels'].tolist()) <= {0, 1, 2}


def test_mmseg_ade_dataset(ade_root):
    from mmcv.transforms import LoadImageFromFile
    from mmseg.datasets import ADE20KDataset, BaseSegDataset
    from mmseg.datasets.transforms import LoadAnnotations

    pipeline = [LoadImageFromFile(), LoadAnnotations()]
    prefix = dict(img_path='images/validation',
                  seg_map_path='annotations/validation')
    ds = ADE20KDataset(data_root=ade_root, data_prefix=prefix,
                       pipeline=pipeline)
    assert len(ds) == SMALL['num_val']
    sample = ds[0]
    assert sample['img'].shape == (96, 96, 3)
    # reduce_zero_label shifts 1..4 to 0..3 (class ids of DEMO_ADE_CLASSES).
    assert set(np.unique(sample['gt_seg_map']).tolist()) <= {0, 1, 2, 3}

    # The way to get the demo class names: ADE20KDataset only accepts
    # subsets of the ADE20K classes.
    ds = BaseSegDataset(data_root=ade_root, data_prefix=prefix,
                        img_suffix='.jpg', seg_map_suffix='.png',
                        reduce_zero_label=True,
                        metainfo=dict(classes=DEMO_ADE_CLASSES),
                        pipeline=pipeline)
    assert ds.metainfo['classes'] == DEMO_ADE_CLASSES
    assert len(ds) == SMALL['num_val']
    assert set(np.unique(ds[1]['gt_seg_map']).tolist()) <= {0, 1, 2, 3}
