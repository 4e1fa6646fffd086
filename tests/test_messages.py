"""Messages that name the file or key and the fix, where the tools used to end in a library's raw error."""
import json
import os
import os.path as osp
import subprocess
import sys

import cv2
import numpy as np
import pytest
from mmengine.config import Config

from conftest import CONFIGS, REPO
from mmvisatt.engine import entrypoints


def test_an_imagenet_split_folder_without_class_folders_is_named(tmp_path):
    """The shipped ImageNet config (``split='train'``, no data_prefix) on a data root whose train/ holds loose
    images: mmpretrain would stop with 'number of subfolders (0) doesn't match the number of specified classes'."""
    from mmvisatt.engine.preflight import MissingDataError, check_data
    cfg = Config.fromfile(osp.join(CONFIGS, 'imagenet_reswin_t.py'))
    for split in ('train', 'val'):
        (tmp_path / split).mkdir()
        cv2.imwrite(str(tmp_path / split / 'img_0001.JPEG'), np.zeros((8, 8, 3), np.uint8))
        cfg[f'{split}_dataloader'].dataset.data_root = str(tmp_path)
    with pytest.raises(MissingDataError, match=rf'{tmp_path / "train"} holds 1 images but no class sub-folders'):
        check_data(cfg, ('train_dataloader', 'val_dataloader'))
    # a meta/<split>.txt list is what mmpretrain reads then: no folder check
    (tmp_path / 'meta').mkdir()
    for split in ('train', 'val'):
        (tmp_path / 'meta' / f'{split}.txt').write_text('img_0001.JPEG 0\n')
    check_data(cfg, ('train_dataloader', 'val_dataloader'))


def test_format_only_without_an_output_is_refused_before_testing(tmp_path):
    from mmvisatt.engine.preflight import ConfigKeyError, check_format_only
    cfg = Config.fromfile(osp.join(CONFIGS, 'mask_rcnn_reswin_t_3x.py'))
    cfg.test_evaluator.format_only = True
    with pytest.raises(ConfigKeyError, match=r'test_evaluator.format_only=True .* add --cfg-options '
                                             r'test_evaluator.outfile_prefix=work_dirs/results/coco'):
        check_format_only(cfg)
    cfg.test_evaluator.outfile_prefix = str(tmp_path / 'coco')
    check_format_only(cfg)
    seg = Config.fromfile(osp.join(CONFIGS, 'upernet_reswin_t_160k_ade20k.py'))
    seg.test_evaluator.format_only = True
    with pytest.raises(ConfigKeyError, match=r'test_evaluator.output_dir='):
        check_format_only(seg)
    # through tools/test.py's entry: before the checkpoint or the data are looked at
    with pytest.raises(ConfigKeyError, match='outfile_prefix'):
        entrypoints.prepare_test([osp.join(CONFIGS, 'mask_rcnn_reswin_t_3x.py'), str(tmp_path / 'missing.pth'),
                                  '--cfg-options', 'test_evaluator.format_only=True'])


def test_infer_on_a_url_says_to_download_it_first():
    from mmvisatt.apis.inference import collect_images
    from mmvisatt.engine.preflight import InferenceError
    url = 'https://example.com/demo.jpg'
    with pytest.raises(InferenceError, match=r'is a URL: tools/infer.py reads local files only.*curl -LO '):
        collect_images(url)


def test_a_base_written_relative_to_the_working_directory_is_named(tmp_path, monkeypatch):
    """A user config in my_configs/ whose _base_ names configs/... as seen from the repository root: mmengine
    reports my_configs/configs/..., a path the user never wrote."""
    monkeypatch.chdir(REPO)
    folder = tmp_path / 'my_configs'
    folder.mkdir()
    config = folder / 'my_mask_rcnn.py'
    config.write_text("_base_ = 'configs/mask_rcnn_reswin_t_3x.py'\n")
    with pytest.raises(entrypoints.ConfigFileError) as error:
        entrypoints.load_config_file(str(config))
    message = str(error.value)
    assert "its _base_ 'configs/mask_rcnn_reswin_t_3x.py' is not a file" in message
    assert 'relative to the working directory' in message and "config file's own folder" in message
    assert repr(osp.relpath(osp.join(REPO, 'configs', 'mask_rcnn_reswin_t_3x.py'), folder)) in message
    # a base that exists nowhere is named too
    config.write_text("_base_ = ['../nowhere/base.py']\n")
    with pytest.raises(entrypoints.ConfigFileError, match=r"its _base_ '../nowhere/base.py' is not a file"):
        entrypoints.load_config_file(str(config))


def test_launcher_pytorch_without_torchrun_says_how_to_start(tiny_det_config, tmp_path, monkeypatch):
    for name in ('RANK', 'WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT', 'LOCAL_RANK'):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match=r'--launcher pytorch needs the process variables torchrun sets '
                                         r'\(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT missing\).*dist_train.sh'):
        entrypoints.train_main([tiny_det_config, '--demo', '--work-dir', str(tmp_path), '--launcher', 'pytorch'])


def test_benchmark_out_under_a_file_fails_before_measuring(tmp_path):
    blocker = tmp_path / 'results'
    blocker.write_text('a file')
    run = subprocess.run([sys.executable, osp.join(REPO, 'tools', 'analysis', 'benchmark.py'), '--backbone',
                          'reswin_t', '--shape', '32', '--repeats', '1', '--warmup', '0', '--measure', 'inference',
                          '--out', str(blocker / 'bench.json')], capture_output=True, text=True, timeout=300)
    assert run.returncode != 0
    assert f'--out {blocker / "bench.json"}: {blocker} is a file, not a folder' in run.stderr
    assert 'reswin_t' not in run.stdout  # nothing was measured


def test_the_backbone_only_load_from_refusal_suggests_options_that_work(tiny_det_config, tmp_path):
    """The suggested --cfg-options start the backbone from the file whether the config's init_cfg is a dict or
    None (mmengine refuses to merge a dict into None without _delete_)."""
    import torch
    from mmengine.registry import MODELS

    from mmvisatt.checkpoint import CheckpointMismatchError
    cfg = Config.fromfile(tiny_det_config)
    backbone = MODELS.build(dict(cfg.model.backbone, init_cfg=None))
    path = tmp_path / 'imagenet.pth'
    torch.save({'model': backbone.state_dict()}, path)  # a release file: backbone keys without a prefix
    args = [tiny_det_config, '--demo', '--work-dir', str(tmp_path / 'work')]
    with pytest.raises(CheckpointMismatchError) as error:
        entrypoints.prepare_train(args + ['--cfg-options', f'load_from={path}'])
    suggested = str(error.value).split('pass --cfg-options ', 1)[1].split(' instead of load_from')[0].split()
    assert suggested[0] == 'model.backbone.init_cfg._delete_=True'
    without_init = tmp_path / 'no_init.py'
    without_init.write_text(f'_base_ = [{tiny_det_config!r}]\nmodel = dict(backbone=dict(init_cfg=None))\n')
    for config in (tiny_det_config, str(without_init)):
        cfg = entrypoints.prepare_train([config, '--demo', '--work-dir', str(tmp_path / 'work'), '--cfg-options',
                                         *suggested])
        assert cfg.model.backbone.init_cfg == dict(type='Pretrained', checkpoint=str(path))


def test_too_many_dropped_boxes_stop_before_training(tmp_path):
    """14 of 17 boxes outside their images (given as x1, y1, x2, y2 in another image's size, say)."""
    from mmvisatt.engine.preflight import AnnotationError, check_dataset_contents
    (tmp_path / 'images').mkdir()
    cv2.imwrite(str(tmp_path / 'images' / '1.jpg'), np.zeros((48, 64, 3), np.uint8))
    anns = [dict(id=i, image_id=1, category_id=1, bbox=[200, 200, 10, 10] if i > 3 else [4, 4, 10, 10],
                 area=100, iscrowd=0, segmentation=[[4, 4, 14, 4, 14, 14, 4, 14]]) for i in range(1, 18)]
    data = dict(images=[dict(id=1, file_name='1.jpg', width=64, height=48)], annotations=anns,
                categories=[dict(id=1, name='a')])
    (tmp_path / 'ann.json').write_text(json.dumps(data))
    cfg = Config.fromfile(osp.join(CONFIGS, 'mask_rcnn_reswin_t_3x.py'))
    for split in ('train', 'val', 'test'):
        cfg[f'{split}_dataloader'].dataset.update(data_root=str(tmp_path), ann_file='ann.json',
                                                  data_prefix=dict(img='images/'), metainfo=dict(classes=('a', )))
    cfg.model.roi_head.bbox_head.num_classes = cfg.model.roi_head.mask_head.num_classes = 1
    with pytest.raises(AnnotationError, match=r'14 of 17 annotations have zero area or lie outside their image'):
        check_dataset_contents(cfg, 'mmdet', ('train_dataloader', ))
    assert os.path.isfile(tmp_path / 'ann.json')
