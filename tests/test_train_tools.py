"""The logic behind tools/train.py and tools/test.py: argument semantics, pre-flight checks, the --demo transform."""
import copy
import json
import os.path as osp

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import DefaultScope
from PIL import Image

from conftest import CONFIGS
from mmvisatt.datasets import DEMO_ADE_CLASSES, DEMO_COCO_CLASSES
from mmvisatt.engine import DemoSettings, prepare_test, prepare_train, to_demo_config
from mmvisatt.engine.entrypoints import setup_distributed
from mmvisatt.engine.preflight import MissingCheckpointError, MissingDataError

MASK_3X = osp.join(CONFIGS, 'mask_rcnn_reswin_t_3x.py')
CASCADE_3X = osp.join(CONFIGS, 'cascade_mask_rcnn_reswin_t_3x.py')


@pytest.fixture
def fake_coco(tmp_path, monkeypatch):
    """Run from a directory holding a COCO layout of one image per split, as if the dataset were downloaded."""
    from mmdet.datasets import CocoDataset
    categories = [dict(id=i + 1, name=name) for i, name in enumerate(CocoDataset.METAINFO['classes'])]
    for split in ('train2017', 'val2017'):
        (tmp_path / 'data/coco' / split).mkdir(parents=True)
        Image.new('RGB', (64, 48), (90, 120, 150)).save(tmp_path / 'data/coco' / split / '1.jpg')
        data = dict(images=[dict(id=1, file_name='1.jpg', width=64, height=48)], categories=categories,
                    annotations=[dict(id=1, image_id=1, category_id=1, bbox=[8, 8, 20, 16], area=320, iscrowd=0,
                                      segmentation=[[8, 8, 28, 8, 28, 24, 8, 24]])])
        (tmp_path / 'data/coco/annotations').mkdir(exist_ok=True)
        (tmp_path / f'data/coco/annotations/instances_{split}.json').write_text(json.dumps(data))
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def fake_checkpoint(fake_coco):
    path = fake_coco / 'checkpoints/reswin_tiny_patch4_window7_224.pth'
    path.parent.mkdir()
    torch.save({}, path)  # a real (empty) checkpoint: a 0-byte file is refused as not a checkpoint
    return path


def test_missing_data_says_where_coco_goes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(MissingDataError) as error:
        prepare_train([MASK_3X])
    message = str(error.value)
    for expected in ('COCO', 'data/coco/annotations/instances_train2017.json', 'data/coco/train2017/',
                     'data/coco/val2017/', 'cocodataset.org', '--demo'):
        assert expected in message, (expected, message)


def test_missing_checkpoint_says_where_to_get_it(fake_coco):
    with pytest.raises(MissingCheckpointError) as error:
        prepare_train([MASK_3X])
    message = str(error.value)
    for expected in ('checkpoints/reswin_tiny_patch4_window7_224.pth', 'ADiko1997/ReViT',
                     'swin_tiny_patch4_window7_224.pth', '--cfg-options model.backbone.init_cfg.checkpoint=PATH',
                     # a login node has no browser for the Google Drive link
                     'On a node without a browser: pip install gdown && gdown 14Wronoy-Bm-m9BJwHXgjDYJNTOouj_m5 -O '
                     'checkpoints/reswin_tiny_patch4_window7_224.pth'):
        assert expected in message, (expected, message)


def test_checkpoint_given_on_the_command_line(fake_coco, tmp_path):
    other = tmp_path / 'swin_tiny_patch4_window7_224.pth'
    torch.save({}, other)
    cfg = prepare_train([MASK_3X, '--cfg-options', f'model.backbone.init_cfg.checkpoint={other}'])
    assert cfg.model.backbone.init_cfg.checkpoint == str(other)


def test_cfg_options_and_work_dir(fake_checkpoint):
    cfg = prepare_train([MASK_3X, '--cfg-options', 'train_dataloader.batch_size=4', 'optim_wrapper.optimizer.lr=3e-4',
                         'model.backbone.drop_path_rate=0.1', 'param_scheduler.1.milestones=[20,30]'])
    assert cfg.train_dataloader.batch_size == 4
    assert cfg.optim_wrapper.optimizer.lr == pytest.approx(3e-4)
    assert cfg.optim_wrapper.optimizer.weight_decay == pytest.approx(0.05)  # the rest of the recipe is kept
    assert cfg.model.backbone.drop_path_rate == pytest.approx(0.1)
    assert cfg.param_scheduler[1].milestones == [20, 30]
    assert cfg.work_dir == './work_dirs/mask_rcnn_reswin_t_3x'
    assert prepare_train([MASK_3X, '--work-dir', 'elsewhere']).work_dir == 'elsewhere'


def test_resume_semantics(fake_checkpoint):
    cfg = prepare_train([MASK_3X])
    assert cfg.resume is False and cfg.load_from is None
    cfg = prepare_train([MASK_3X, '--resume'])
    assert cfg.resume is True and cfg.load_from is None  # latest checkpoint of the work dir
    (fake_checkpoint.parent.parent / 'some').mkdir()
    torch.save({}, fake_checkpoint.parent.parent / 'some/iter_8.pth')
    cfg = prepare_train([MASK_3X, '--resume', 'some/iter_8.pth'])
    assert cfg.resume is True and cfg.load_from == 'some/iter_8.pth'


def test_auto_scale_lr(fake_checkpoint, tmp_path):
    assert prepare_train([MASK_3X]).auto_scale_lr == dict(enable=False, base_batch_size=16)
    assert prepare_train([MASK_3X, '--auto-scale-lr']).auto_scale_lr == dict(enable=True, base_batch_size=16)
    with pytest.raises(RuntimeError, match='auto_scale_lr'):
        prepare_train([MASK_3X, '--auto-scale-lr', '--cfg-options', 'auto_scale_lr=None'])


def test_amp_needs_a_gpu(fake_checkpoint):
    import torch
    if torch.cuda.is_available():
        assert prepare_train([MASK_3X, '--amp']).optim_wrapper.type == 'AmpOptimWrapper'
    else:
        with pytest.raises(RuntimeError, match='--amp needs a GPU'):
            prepare_train([MASK_3X, '--amp'])


def test_launcher_and_cpu_backend(fake_checkpoint):
    import torch
    cfg = prepare_train([MASK_3X, '--launcher', 'none'])
    assert cfg.launcher == 'none'
    setup_distributed(cfg)
    assert cfg.env_cfg.dist_cfg.backend == ('nccl' if torch.cuda.is_available() else 'gloo')


def test_demo_transform_mask_rcnn(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no data/coco and no checkpoints/ here: the demo needs neither
    cfg = prepare_train([MASK_3X, '--demo'])
    heads = cfg.model.roi_head
    assert heads.bbox_head.num_classes == heads.mask_head.num_classes == len(DEMO_COCO_CLASSES) == 3
    assert cfg.model.backbone.init_cfg is None
    assert cfg.model.backbone.type == 'ReSwinTransformer' and cfg.model.backbone.drop_path_rate == 0.2
    # RoI counts scaled down with the images
    settings = DemoSettings()
    assert cfg.model.train_cfg.rcnn.sampler.num == settings.rois_per_image
    assert cfg.model.test_cfg.rpn.max_per_img == settings.proposals_per_image
    assert cfg.model.test_cfg.rcnn.max_per_img == settings.dets_per_image
    for loader in (cfg.train_dataloader, cfg.val_dataloader, cfg.test_dataloader):
        dataset = loader.dataset
        assert dataset.type == 'CocoDataset' and dataset.metainfo == dict(classes=DEMO_COCO_CLASSES)
        assert osp.isfile(osp.join(dataset.data_root, dataset.ann_file))
    assert cfg.val_evaluator.metric == ['bbox', 'segm']
    assert osp.isfile(cfg.val_evaluator.ann_file)
    # same recipe, short iteration-based schedule
    assert cfg.optim_wrapper.optimizer.type == 'AdamW'
    assert cfg.optim_wrapper.paramwise_cfg.custom_keys.norm == dict(decay_mult=0.)
    # the residual mode the released ReSwin-T weights were trained with; the fp16 recipe in float32 on a CPU
    assert cfg.model.backbone.residual_mode == 'official'
    assert cfg.optim_wrapper.type == ('AmpOptimWrapper' if torch.cuda.is_available() else 'OptimWrapper')
    assert cfg.train_cfg.type == 'IterBasedTrainLoop' and cfg.train_cfg.max_iters <= 300
    # constant lr after the warmup, or the recipe's steps at the same fraction of the run
    warmup, = cfg.param_scheduler
    assert warmup.type == 'LinearLR' and warmup.end < cfg.train_cfg.max_iters
    kept = to_demo_config(Config.fromfile(MASK_3X), DemoSettings(keep_decay=True, max_iters=60))
    n = kept.train_cfg.max_iters
    warmup, steps = kept.param_scheduler
    assert steps.type == 'MultiStepLR' and not steps.by_epoch
    assert steps.milestones == [round(27 * n / 36), round(33 * n / 36)] and steps.end == n
    assert {h.type for h in cfg.custom_hooks} >= {'EvalProgressHook', 'DemoReportHook'}
    assert cfg.work_dir == './work_dirs/mask_rcnn_reswin_t_3x_demo'


def test_demo_transform_cascade_and_overrides(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = prepare_train([CASCADE_3X, '--demo', '--cfg-options', 'train_cfg.max_iters=5',
                         'optim_wrapper.optimizer.lr=1e-3'])
    assert [h.num_classes for h in cfg.model.roi_head.bbox_head] == [3, 3, 3]
    assert cfg.model.roi_head.mask_head.num_classes == 3
    assert [r.sampler.num for r in cfg.model.train_cfg.rcnn] == [DemoSettings().rois_per_image] * 3
    # --cfg-options apply after --demo, so they can shorten it further
    assert cfg.train_cfg.max_iters == 5 and cfg.optim_wrapper.optimizer.lr == pytest.approx(1e-3)


def test_demo_test_config(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ckpt = tmp_path / 'model.pth'
    torch.save({}, ckpt)
    cfg, _ = prepare_test([MASK_3X, str(ckpt), '--demo'])
    assert cfg.load_from == str(ckpt) and cfg.model.roi_head.bbox_head.num_classes == 3
    assert cfg.test_dataloader.dataset.ann_file == 'annotations/instances_val.json'
    with pytest.raises(MissingDataError):
        prepare_test([MASK_3X, str(ckpt)])
    with pytest.raises(FileNotFoundError, match='checkpoint not found'):
        prepare_test([MASK_3X, str(tmp_path / 'missing.pth'), '--demo'])


def test_demo_transform_segmentation():
    """The same switch for an mmseg config: ADE-format demo data, 4 classes in decode and auxiliary heads."""
    cfg = Config(dict(
        default_scope='mmseg',
        model=dict(type='EncoderDecoder', data_preprocessor=dict(type='SegDataPreProcessor', size=(512, 512)),
                   backbone=dict(type='ReSwinTransformer', init_cfg=dict(type='Pretrained', checkpoint='x.pth')),
                   decode_head=dict(type='UPerHead', num_classes=150),
                   auxiliary_head=dict(type='FCNHead', num_classes=150)),
        optim_wrapper=dict(optimizer=dict(type='AdamW', lr=6e-5)),
        train_cfg=dict(type='IterBasedTrainLoop', max_iters=160000, val_interval=16000),
        param_scheduler=[dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=1500),
                         dict(type='PolyLR', power=1.0, begin=1500, end=160000, eta_min=0.0, by_epoch=False)],
        default_hooks=dict()))
    kept = to_demo_config(copy.deepcopy(cfg), DemoSettings(keep_decay=True))
    to_demo_config(cfg)
    assert [s.type for s in cfg.param_scheduler] == ['LinearLR']  # constant lr after the warmup
    assert cfg.model.decode_head.num_classes == cfg.model.auxiliary_head.num_classes == len(DEMO_ADE_CLASSES) == 4
    assert cfg.model.data_preprocessor.size == (DemoSettings.img_size, DemoSettings.img_size)
    assert cfg.train_dataloader.dataset.type == 'BaseSegDataset'
    assert cfg.val_evaluator.type == 'IoUMetric'
    n = kept.train_cfg.max_iters
    poly = kept.param_scheduler[1]
    assert poly.type == 'PolyLR' and poly.end == n and poly.begin == max(1, round(1500 * n / 160000))
    from mmseg.registry import DATASETS
    from mmseg.utils import register_all_modules
    register_all_modules(init_default_scope=False)
    with DefaultScope.overwrite_default_scope('mmseg'):
        dataset = DATASETS.build(cfg.val_dataloader.dataset)
        sample = dataset[0]
    labels = set(sample['data_samples'].gt_sem_seg.data.unique().tolist())
    assert len(dataset) == 50 and labels <= {0, 1, 2, 3}


def test_demo_trains_the_fan_segformer_recipe(tmp_path, monkeypatch):
    """The FAN Cityscapes recipe (SegFormer head on the stride-16 fourth level) runs on the demo data like every
    segmentation config: two iterations, a validation, a checkpoint."""
    from mmvisatt.engine import train_main
    monkeypatch.chdir(tmp_path)
    config = osp.join(CONFIGS, 'segformer_fan_hybrid_t_160k_cityscapes.py')
    runner = train_main([config, '--demo', '--work-dir', str(tmp_path / 'run'), '--cfg-options',
                         'train_cfg.max_iters=2', 'val_dataloader.dataset.indices=2',
                         'visualizer.name=fan_segformer_demo'])
    model = runner.model
    assert type(model.decode_head).__name__ == 'SegformerHead' and model.decode_head.num_classes == 4
    assert model.backbone.strides == (4, 8, 16, 16) and not hasattr(model.backbone, 'downsample')
    assert osp.isfile(tmp_path / 'run' / 'iter_2.pth')
