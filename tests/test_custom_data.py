"""The README's own-data and fine-tuning path: the example configs of configs/examples/ train on data in their
documented layouts (generated here from the demo sets), each detector type and a segmenter, and a trained detector
fine-tunes on other classes. The backbone is shrunk, the images resized to 128 px and the RoI heads' samples cut
to 64 per image so that each run takes seconds; datasets, classes, heads and the rest of the recipe are the
examples' own."""
import json
import os
import os.path as osp
import shutil

import cv2
import numpy as np
import pytest
from mmengine.config import Config

from conftest import CONFIGS
from mmvisatt.datasets import prepare_demo_ade, prepare_demo_coco
from mmvisatt.engine import train_main

EXAMPLES = osp.join(CONFIGS, 'examples')
TINY = "dict(_delete_=True, embed_dims=16, depths=(1, 1, 1, 1), num_heads=(1, 1, 2, 2))"
DET_PIPELINES = '''
train_pipeline = [
    dict(type='LoadCheckedImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True, with_mask={mask}),
    dict(type='Resize', scale=(128, 128), keep_ratio=True),
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadCheckedImageFromFile'),
    dict(type='Resize', scale=(128, 128), keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True, with_mask={mask}),
    dict(type='PackDetInputs', meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor')),
]
'''
LOADERS = '''
train_dataloader = dict(batch_size=2, num_workers=0, persistent_workers=False, dataset=dict(pipeline=train_pipeline))
val_dataloader = dict(num_workers=0, persistent_workers=False, dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader
train_cfg = dict(max_epochs={epochs}, val_interval=1)
optim_wrapper = dict(type='OptimWrapper', _delete_=True, optimizer=dict(type='AdamW', lr=1e-4))
param_scheduler = []
default_hooks = dict(logger=dict(interval=1))
visualizer = dict(name='{name}')
'''


@pytest.fixture(scope='module')
def workspace(tmp_path_factory):
    """A working directory with data/my_coco (the demo COCO set's squares and circles as 'cat' and 'dog', 4
    training and 2 validation images) and data/my_seg (4 + 2 demo ADE images, its square, circle and triangle as
    the example's three classes), as the examples expect them."""
    root = tmp_path_factory.mktemp('own_data')
    demo = prepare_demo_coco()
    for split, count in (('train', 4), ('val', 2)):
        with open(osp.join(demo, 'annotations', f'instances_{split}.json')) as f:
            coco = json.load(f)
        images = coco['images'][:count]
        ids = {image['id'] for image in images}
        (root / 'data' / 'my_coco' / split).mkdir(parents=True)
        for image in images:
            shutil.copy(osp.join(demo, split, image['file_name']), root / 'data' / 'my_coco' / split)
        names = {c['id']: c['name'] for c in coco['categories']}
        keep = {cid: new for cid, new in zip(sorted(names), ('cat', 'dog'))}
        coco['images'] = images
        coco['annotations'] = [a for a in coco['annotations'] if a['image_id'] in ids and a['category_id'] in keep]
        coco['categories'] = [dict(c, name=keep[c['id']]) for c in coco['categories'] if c['id'] in keep]
        (root / 'data' / 'my_coco' / 'annotations').mkdir(exist_ok=True)
        with open(root / 'data' / 'my_coco' / 'annotations' / f'instances_{split}.json', 'w') as f:
            json.dump(coco, f)
    ade = prepare_demo_ade()
    for split, count in (('training', 4), ('validation', 2)):
        for kind in ('images', 'annotations'):
            target = root / 'data' / 'my_seg' / kind / split
            target.mkdir(parents=True)
            for name in sorted(os.listdir(osp.join(ade, kind, split)))[:count]:
                if kind == 'images':
                    shutil.copy(osp.join(ade, kind, split, name), target)
                    continue
                # the demo's four labels become three classes (its first, 'background', is ignored like 0)
                labels = cv2.imread(osp.join(ade, kind, split, name), cv2.IMREAD_UNCHANGED)
                labels = np.where(labels == 1, 0, np.maximum(labels.astype(np.int16) - 1, 0)).astype(np.uint8)
                cv2.imwrite(str(target / name), labels)
    return root


def _tiny_config(workspace, example: str, name: str, epochs: int = 1, extra: str = '') -> str:
    """``example`` with a 16-channel, one-block-per-stage backbone (no ImageNet weights), 128 px images and one
    epoch: written beside the data, returned as a path."""
    cfg = Config.fromfile(osp.join(EXAMPLES, example))
    det = cfg.default_scope == 'mmdet'
    out_indices = cfg.model.backbone.get('out_indices', (0, 1, 2, 3))
    channels = [[16, 32, 64, 128][i] for i in out_indices]
    text = [f'_base_ = [{osp.join(EXAMPLES, example)!r}]',
            f'model = dict(backbone=dict(arch={TINY}, init_cfg=None), '
            + (f'neck=dict(in_channels={channels}))' if det else
               f'decode_head=dict(in_channels={channels}), auxiliary_head=dict(in_channels=64))')]
    if det:
        text.append(DET_PIPELINES.format(mask=bool(cfg.model.get('roi_head', {}).get('mask_head'))))
        rcnn = cfg.model.train_cfg.get('rcnn')
        if rcnn is not None:
            # 64 sampled RoIs per image, not 512: Cascade's three 4-conv box heads would otherwise take most of a
            # minute per run on two cores
            stages = [dict(stage.to_dict(), sampler=dict(stage.sampler.to_dict(), num=64))
                      for stage in (rcnn if isinstance(rcnn, list) else [rcnn])]
            text.append(f'model.update(train_cfg=dict(rcnn={stages if isinstance(rcnn, list) else stages[0]!r}))')
    else:
        text.append('''
train_pipeline = [dict(type='LoadCheckedImageFromFile'), dict(type='LoadAnnotations', reduce_zero_label=True),
                  dict(type='RandomCrop', crop_size=(128, 128)), dict(type='PackSegInputs')]
test_pipeline = [dict(type='LoadCheckedImageFromFile'), dict(type='LoadAnnotations', reduce_zero_label=True),
                 dict(type='PackSegInputs')]
model.update(data_preprocessor=dict(size=(128, 128)))''')
        epochs_loop = "train_cfg = dict(_delete_=True, type='IterBasedTrainLoop', max_iters=2, val_interval=2)\n"
        text.append(epochs_loop)
    loaders = LOADERS.format(epochs=epochs, name=name)
    if not det:
        loaders = loaders.replace(f'train_cfg = dict(max_epochs={epochs}, val_interval=1)\n', '')
    text.append(loaders + extra)
    path = workspace / f'{name}.py'
    path.write_text('\n'.join(text))
    return str(path)


@pytest.fixture
def in_workspace(workspace, monkeypatch):
    monkeypatch.chdir(workspace)
    return workspace


@pytest.mark.parametrize('example', ['mask_rcnn_reswin_t_3x_my_coco.py', 'cascade_mask_rcnn_reswin_t_3x_my_coco.py',
                                     'retinanet_reswin_t_1x_my_coco.py', 'upernet_reswin_t_my_seg.py'])
def test_the_own_data_examples_train_and_evaluate(in_workspace, example):
    name = example[:-3]
    runner = train_main([_tiny_config(in_workspace, example, name), '--work-dir', str(in_workspace / name)])
    classes = runner.train_dataloader.dataset.metainfo['classes']
    assert classes == Config.fromfile(osp.join(EXAMPLES, example)).classes
    heads = [m.num_classes for m in runner.model.modules() if isinstance(getattr(m, 'num_classes', None), int)
             and m.num_classes > 1]
    assert heads and set(heads) == {len(classes)}, heads  # every class-predicting head (cascade: three stages)
    assert runner.iter == 2
    metrics = runner.message_hub.log_scalars
    assert 'val/time' in metrics, sorted(metrics)  # and evaluated on the validation images


def test_a_trained_detector_fine_tunes_on_other_classes(in_workspace, tiny_det_config):
    """A 3-class Mask R-CNN (the demo's classes) becomes the start of the 2-class example: every tensor whose size
    does not depend on the classes loads; the box classifier and the mask logits start anew."""
    from mmvisatt.checkpoint import load_checkpoint_file
    base = in_workspace / 'coco_run'
    train_main([tiny_det_config, '--demo', '--work-dir', str(base), '--cfg-options', 'train_cfg.max_iters=1',
                'val_dataloader.dataset.indices=1', 'visualizer.name=finetune_base'])
    trained = load_checkpoint_file(str(base / 'iter_1.pth'))['state_dict']
    config = _tiny_config(in_workspace, 'finetune_mask_rcnn_reswin_t_my_coco.py', 'finetune', epochs=0,
                          extra=f'load_from = {str(base / "iter_1.pth")!r}\n')
    cfg = Config.fromfile(config)
    assert cfg.model.roi_head.bbox_head.num_classes == 2 and cfg.optim_wrapper.optimizer.lr == 1e-4
    assert Config.fromfile(osp.join(EXAMPLES, 'finetune_mask_rcnn_reswin_t_my_coco.py')).load_from.endswith('.pth')
    runner = train_main([config, '--work-dir', str(in_workspace / 'finetune')])
    model = runner.model.state_dict()
    changed = sorted(k for k in trained if k in model and model[k].shape != trained[k].shape)
    assert changed == ['roi_head.bbox_head.fc_cls.bias', 'roi_head.bbox_head.fc_cls.weight',
                       'roi_head.bbox_head.fc_reg.bias', 'roi_head.bbox_head.fc_reg.weight',
                       'roi_head.mask_head.conv_logits.bias', 'roi_head.mask_head.conv_logits.weight']
    loaded = [k for k in trained if k in model and model[k].shape == trained[k].shape]
    assert loaded and all((model[k] == trained[k]).all() for k in loaded)
