"""tools/infer.py and mmvisatt.apis: a checkpoint trained with ``--demo`` draws its detections / segmentation on
demo images, with the class names stored in the checkpoint; checkpoints that do not fit are refused."""
import os.path as osp
import shutil
import subprocess

import cv2
import mmcv
import numpy as np
import pytest
import torch

from conftest import CONFIGS, REPO
from mmvisatt.apis import InferenceError, Predictor, check_weights_fit, collect_images, inference_config
from mmvisatt.apis.inference import drop_pretrained_init, output_names
from mmvisatt.datasets import DEMO_ADE_CLASSES, DEMO_COCO_CLASSES, prepare_demo_ade, prepare_demo_coco
from mmvisatt.engine import DemoSettings, train_main

MASK_3X = osp.join(CONFIGS, 'mask_rcnn_reswin_t_3x.py')


def _changed_fraction(drawn_bgr: np.ndarray, image_path: str) -> float:
    image = mmcv.imread(image_path)
    assert drawn_bgr.shape == image.shape
    return float((np.abs(drawn_bgr.astype(int) - image.astype(int)).max(axis=2) > 10).mean())


def test_collect_images(tmp_path):
    for name in ('b.png', 'a.JPG', 'notes.txt'):
        (tmp_path / name).write_bytes(b'')
    (tmp_path / 'sub').mkdir()
    assert collect_images(str(tmp_path)) == [str(tmp_path / 'a.JPG'), str(tmp_path / 'b.png')]
    assert collect_images([str(tmp_path / 'b.png'), str(tmp_path)])[0] == str(tmp_path / 'b.png')
    with pytest.raises(FileNotFoundError, match='missing.png'):
        collect_images(str(tmp_path / 'missing.png'))
    with pytest.raises(InferenceError, match='not an image file'):
        collect_images(str(tmp_path / 'notes.txt'))
    with pytest.raises(InferenceError, match='no images'):
        collect_images(str(tmp_path / 'sub'))
    assert output_names(['x/a.jpg', 'y/a.png', 'b.jpeg']) == ['a.png', 'a_1.png', 'b.png']


def test_inference_config_drops_pretrained_and_annotations():
    cfg = inference_config(MASK_3X)
    assert cfg.model.backbone.init_cfg is None  # checkpoints/reswin_tiny_...pth need not exist for inference
    assert cfg.model.roi_head.bbox_head.num_classes == 80
    # the inferencers look for mmcv's loader to put theirs in its place
    assert [t.type for t in cfg.test_dataloader.dataset.pipeline] == ['LoadImageFromFile', 'Resize', 'PackDetInputs']
    assert 'vis_backends' not in cfg.visualizer
    demo = inference_config(MASK_3X, demo=True, cfg_options={'model.test_cfg.rcnn.max_per_img': 7})
    assert demo.model.roi_head.bbox_head.num_classes == demo.model.roi_head.mask_head.num_classes == 3
    assert demo.test_dataloader.dataset.pipeline[1].scale == (DemoSettings.img_size, DemoSettings.img_size)
    assert demo.model.test_cfg.rcnn.max_per_img == 7
    with pytest.raises(InferenceError, match="default_scope='mmdet'"):
        inference_config(osp.join(CONFIGS, 'imagenet_reswin_t.py'))
    with pytest.raises(FileNotFoundError, match='config not found'):
        inference_config(osp.join(CONFIGS, 'no_such_config.py'))


def test_drop_pretrained_init():
    model = dict(backbone=dict(init_cfg=[dict(type='Pretrained', checkpoint='x.pth'), dict(type='Constant', val=1)]),
                 heads=[dict(init_cfg=dict(type='Pretrained', checkpoint='y.pth'))], neck=dict(init_cfg=None))
    assert drop_pretrained_init(model) == 2
    assert model == dict(backbone=dict(init_cfg=[dict(type='Constant', val=1)]), heads=[dict(init_cfg=None)],
                         neck=dict(init_cfg=None))


def test_check_weights_fit():
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    state = {f'module.{k}': v for k, v in model.state_dict().items()}
    check_weights_fit(model, {'state_dict': state})
    state['module.1.weight'] = torch.zeros(5, 3)
    del state['module.1.bias']
    with pytest.raises(InferenceError) as error:
        check_weights_fit(model, {'state_dict': state}, hint='HINT')
    message = str(error.value)
    for expected in ('1.weight (5, 3) in the checkpoint, (2, 3) in the model', '1 of the model\'s 4 tensors missing',
                     '1.bias', 'HINT'):
        assert expected in message, (expected, message)


@pytest.mark.slow
def test_infer_detection_demo_checkpoint(demo_det_run, tiny_det_config, tmp_path, python):
    checkpoint = osp.join(demo_det_run, 'iter_3.pth')
    image = osp.join(prepare_demo_coco(img_size=DemoSettings.img_size), 'val', '000000.png')
    out_dir = tmp_path / 'vis'
    proc = subprocess.run([python, osp.join(REPO, 'tools', 'infer.py'), image, tiny_det_config, checkpoint, '--demo',
                           '--score-thr', '0', '--device', 'cpu', '--out', str(out_dir)],
                          cwd=str(tmp_path), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    drawn = mmcv.imread(str(out_dir / '000000.png'))
    assert _changed_fraction(drawn, image) > 0.05
    line = proc.stdout.strip().splitlines()[-1]
    assert line.startswith(f'{image} -> {out_dir / "000000.png"}: ')
    names = {item.rsplit(' ', 1)[0] for item in line.split(': ', 1)[1].split(', ') if not item.startswith('...')}
    assert names and names <= set(DEMO_COCO_CLASSES), line

    # class names come from the checkpoint; nothing above the threshold -> the image comes back untouched
    predictor = Predictor(tiny_det_config, checkpoint, device='cpu', demo=True)
    assert predictor.classes == DEMO_COCO_CLASSES
    (result, ) = predictor.run(image, str(tmp_path / 'none'), score_thr=1.0)
    assert result.summary == [] and _changed_fraction(mmcv.imread(result.out_file), image) == 0

    # a folder with a bad file of each kind: each is named and skipped, the good image is still drawn
    folder = tmp_path / 'mixed'
    folder.mkdir()
    shutil.copy(image, folder / 'good.png')
    (folder / 'empty.png').write_bytes(b'')
    (folder / '._good.png').write_bytes(b'\x00\x05\x16\x07' + bytes(200))
    (folder / 'cut.jpg').write_bytes(cv2.imencode('.jpg', mmcv.imread(image))[1].tobytes()[:300])
    results = predictor.run(str(folder), str(tmp_path / 'mixed_out'), score_thr=1.0)
    assert [osp.basename(r.image) for r in results] == ['good.png']
    bad = folder / 'empty.png'
    bad.unlink()
    (folder / 'good.png').unlink()
    with pytest.raises(InferenceError, match=r'none of the 2 images could be read'):
        predictor.run(str(folder), str(tmp_path / 'mixed_out'))
    from mmvisatt.apis.inference import unreadable_image
    assert 'macOS metadata file' in unreadable_image(str(folder / '._good.png'))
    assert 'is truncated' in unreadable_image(str(folder / 'cut.jpg'))
    (folder / 'empty.png').write_bytes(b'')
    assert 'empty file' in unreadable_image(str(folder / 'empty.png'))

    with pytest.raises(InferenceError, match=r"3 classes \('square', 'circle', 'triangle'\).*needs --demo"):
        Predictor(tiny_det_config, checkpoint, device='cpu')
    with pytest.raises(FileNotFoundError, match='checkpoint not found'):
        Predictor(tiny_det_config, osp.join(demo_det_run, 'iter_99.pth'), demo=True)


TINY_UPERNET = f"""_base_ = [{osp.join(CONFIGS, 'upernet_reswin_t_160k_ade20k.py')!r}]
model = dict(
    backbone=dict(arch=dict(_delete_=True, embed_dims=16, depths=(1, 1, 1, 1), num_heads=(1, 1, 2, 2))),
    decode_head=dict(in_channels=[16, 32, 64, 128], channels=16),
    auxiliary_head=dict(in_channels=64, channels=16))
"""


@pytest.mark.slow
def test_infer_segmentation_demo_checkpoint(tmp_path):
    config = tmp_path / 'upernet_reswin_tiny.py'
    config.write_text(TINY_UPERNET)
    work_dir = tmp_path / 'work'
    train_main([str(config), '--demo', '--work-dir', str(work_dir), '--cfg-options', 'train_cfg.max_iters=2',
                'val_dataloader=None', 'val_cfg=None', 'val_evaluator=None'])
    image = osp.join(prepare_demo_ade(img_size=DemoSettings.img_size), 'images', 'validation', '000000.jpg')
    predictor = Predictor(str(config), str(work_dir / 'iter_2.pth'), device='cpu', demo=True)
    assert predictor.classes == DEMO_ADE_CLASSES
    (result, ) = predictor.run([image], str(tmp_path / 'vis'))
    assert result.out_file == str(tmp_path / 'vis' / '000000.png')
    assert _changed_fraction(mmcv.imread(result.out_file), image) > 0.05
    names = [name for name, _ in result.summary]
    assert names and set(names) <= set(DEMO_ADE_CLASSES)
    assert sum(fraction for _, fraction in result.summary) == pytest.approx(1.0)
