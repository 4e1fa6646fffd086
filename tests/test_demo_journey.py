"""The demo's journey in short runs: an ImageNet config's ``--demo`` pre-trains the backbone on the generated
classification set (stage 1), and a detection config's ``--demo`` starts its backbone from that checkpoint through
``init_cfg``, the converter and the load report, as from an official ImageNet file (stage 2)."""
import os
import os.path as osp
import re

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import MODELS, DefaultScope

from conftest import CONFIGS, REPO
from mmvisatt.checkpoint import load_checkpoint_file
from mmvisatt.datasets import DEMO_COCO_CLASSES
from mmvisatt.engine import prepare_train, to_demo_config, train_main
from mmvisatt.engine.demo import CLASSIFICATION_DEMO

IMAGENET = osp.join(CONFIGS, 'imagenet_reswin_t.py')


@pytest.fixture(scope='module')
def tiny_cls_config(tmp_path_factory) -> str:
    """``imagenet_reswin_t.py`` with the backbone of ``tiny_det_config`` (one block per stage, 16 channels)."""
    path = tmp_path_factory.mktemp('configs') / 'imagenet_reswin_tiny.py'
    path.write_text(
        f"_base_ = [{IMAGENET!r}]\n"
        "model = dict(\n"
        "    backbone=dict(arch=dict(_delete_=True, embed_dims=16, depths=(1, 1, 1, 1), num_heads=(1, 1, 2, 2))),\n"
        "    head=dict(in_channels=128))\n")
    return str(path)


def test_imagenet_demo_keeps_the_model_and_recipe_on_generated_shapes():
    cfg = to_demo_config(Config.fromfile(IMAGENET))
    settings = CLASSIFICATION_DEMO
    assert cfg.model.head.num_classes == len(DEMO_COCO_CLASSES) == cfg.data_preprocessor.num_classes
    assert cfg.model.backbone.type == 'ReSwinTransformer' and cfg.model.backbone.residual_mode == 'official'
    assert cfg.model.backbone.init_cfg is None and not cfg.model.train_cfg.augments
    assert cfg.optim_wrapper.optimizer.type == 'AdamW' and cfg.optim_wrapper.optimizer.lr == settings.lr
    assert cfg.optim_wrapper.paramwise_cfg == Config.fromfile(IMAGENET).optim_wrapper.paramwise_cfg
    # the recipe's epoch-based warmup, counted in iterations, becomes the demo's warmup
    assert [s.type for s in cfg.param_scheduler] == ['LinearLR']
    assert cfg.param_scheduler[0].end == settings.warmup_iters and cfg.param_scheduler[0].by_epoch is False
    assert cfg.train_cfg.max_iters == settings.max_iters and cfg.train_dataloader.batch_size == settings.batch_size
    train, val = cfg.train_dataloader.dataset, cfg.val_dataloader.dataset
    assert train.data_root == val.data_root and train.ann_file == 'meta/train.txt' and val.ann_file == 'meta/val.txt'
    assert train.metainfo.classes == DEMO_COCO_CLASSES
    assert cfg.val_evaluator == dict(type='Accuracy', topk=(1, ))
    # the classification images are not the detection demo's: their files and streams differ
    assert 'imagenet' in osp.basename(train.data_root)


def _report_lines(monkeypatch):
    import mmvisatt.checkpoint.loading as loading
    lines = []
    original = loading.print_log
    monkeypatch.setattr(loading, 'print_log', lambda msg, *a, **k: (lines.append(msg), original(msg, *a, **k)))
    return lines


def test_stage_one_checkpoint_initialises_stage_two(tiny_cls_config, tiny_det_config, tmp_path, monkeypatch):
    stage1 = tmp_path / 'stage1'
    train_main([tiny_cls_config, '--demo', '--work-dir', str(stage1), '--cfg-options', 'train_cfg.max_iters=2',
                'val_dataloader.dataset.indices=4', 'visualizer.name=journey_stage1'])
    checkpoint = stage1 / 'iter_2.pth'
    assert checkpoint.is_file()
    saved = load_checkpoint_file(checkpoint)['state_dict']
    assert saved['head.fc.weight'].shape[0] == len(DEMO_COCO_CLASSES)

    cfg = prepare_train([tiny_det_config, '--demo', '--work-dir', str(tmp_path / 'stage2'), '--cfg-options',
                         f'model.backbone.init_cfg.checkpoint={checkpoint}'])
    assert cfg.model.backbone.init_cfg == dict(type='Pretrained', checkpoint=str(checkpoint))
    lines = _report_lines(monkeypatch)
    with DefaultScope.overwrite_default_scope('mmdet'):
        model = MODELS.build(cfg.model)
    model.init_weights()
    report = [line for line in lines if line.startswith(f'Loaded {checkpoint}')]
    assert len(report) == 1, lines
    backbone = {k[len('backbone.'):]: v for k, v in saved.items() if k.startswith('backbone.')}
    matched = int(re.search(r'(\d+) tensors matched', report[0]).group(1))
    # every tensor the classifier's backbone has; the detector's extra output norms are newly initialised
    assert matched == len(backbone) and 'norm0.weight' in report[0]
    own = model.backbone.state_dict()
    for key, value in backbone.items():
        torch.testing.assert_close(own[key], value, rtol=0, atol=0, msg=key)


def test_make_demo_runs_both_stages():
    makefile = open(osp.join(REPO, 'Makefile')).read()
    stage1 = re.search(r'^DEMO_STAGE1 := (\S+)$', makefile, re.M).group(1)
    assert stage1.endswith(f'/iter_{CLASSIFICATION_DEMO.max_iters}.pth')
    assert 'configs/imagenet_reswin_t.py --demo' in makefile
    assert ('configs/mask_rcnn_reswin_t_3x.py --demo --work-dir work_dirs/demo --cfg-options '
            'model.backbone.init_cfg.checkpoint=$(DEMO_STAGE1)') in makefile


def test_make_passes_the_interpreter_that_creates_the_venv_through():
    """``PYTHON=python3.11 make demo``: the Makefile used PYTHON for the venv's interpreter, so the set-up was handed
    a venv that did not exist yet to create the venv with. PYTHON now reaches tools/setup_env.sh as given, and the
    targets run the venv's interpreter; ``make check`` runs the install check."""
    import shutil
    import subprocess
    if not shutil.which('make'):
        pytest.skip('make is not installed')
    env = dict(os.environ, PYTHON='python3.11', MMVISATT_VENV='/opt/venv')
    database = subprocess.run(['make', '-pn', 'setup'], cwd=REPO, env=env, capture_output=True, text=True).stdout
    assert re.search(r'^# environment\nPYTHON = python3\.11$', database, re.M), 'the Makefile sets PYTHON'
    dry = subprocess.run(['make', '-n', 'check', 'test'], cwd=REPO, env=env, capture_output=True, text=True).stdout
    assert 'bash tools/setup_env.sh' in dry and '/opt/venv/bin/python tools/check_install.py' in dry
    assert '/opt/venv/bin/python -m pytest' in dry
