"""Every task config loads, builds with the mmdet registry, and trains one step on a tiny synthetic batch."""
import glob
import os.path as osp

import pytest
import torch
from mmengine.config import Config
from mmengine.model import revert_sync_batchnorm
from mmengine.optim import build_optim_wrapper
from mmengine.registry import DefaultScope

from conftest import CONFIGS

mmdet = pytest.importorskip('mmdet')
from mmdet.registry import MODELS  # noqa: E402
from mmdet.testing import demo_mm_inputs  # noqa: E402
from mmdet.utils import register_all_modules  # noqa: E402

CONFIG_FILES = sorted(glob.glob(osp.join(CONFIGS, '*.py')))


def _load(path: str) -> Config:
    cfg = Config.fromfile(path)
    # nothing can be downloaded in CI; the init path is covered by the checkpoint tests
    cfg.model.backbone.init_cfg = None
    return cfg


def test_configs_found():
    names = {osp.basename(p) for p in CONFIG_FILES}
    assert {'mask_rcnn_reswin_t_1x.py', 'mask_rcnn_reswin_t_3x.py', 'cascade_mask_rcnn_reswin_t_3x.py'} <= names


@pytest.mark.parametrize('path', CONFIG_FILES, ids=osp.basename)
def test_config_trains_one_step(path):
    cfg = _load(path)
    assert cfg.default_scope == 'mmdet'
    assert cfg.custom_imports == dict(imports=['mmvisatt.models'], allow_failed_imports=False)
    assert cfg.model.backbone.type == 'ReSwinTransformer'
    register_all_modules(init_default_scope=False)
    torch.manual_seed(0)
    with DefaultScope.overwrite_default_scope('mmdet'):
        # as the Runner does outside distributed training (the cascade heads use SyncBN)
        model = revert_sync_batchnorm(MODELS.build(cfg.model))
        model.init_weights()
        model.train()
        batch = demo_mm_inputs(batch_size=1, image_shapes=[(3, 64, 96)], num_items=[2], num_classes=80,
                               with_mask=True)
        data = model.data_preprocessor(batch, True)
        losses = model(**data, mode='loss')
    total, _ = model.parse_losses(losses)
    assert torch.isfinite(total)
    total.backward()
    grads = [p.grad for n, p in model.named_parameters() if n.startswith('backbone.') and p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert model.backbone.alpha.grad is not None


@pytest.mark.parametrize('path', CONFIG_FILES, ids=osp.basename)
def test_recipe_decay_rules(path):
    """AdamW with no weight decay on norms, relative position tables and the residual gate alpha."""
    cfg = _load(path)
    assert cfg.optim_wrapper.optimizer.type == 'AdamW'
    with DefaultScope.overwrite_default_scope('mmdet'):
        model = MODELS.build(cfg.model)
        optim = build_optim_wrapper(model, cfg.optim_wrapper).optimizer
    decay = {id(p): g['weight_decay'] for g in optim.param_groups for p in g['params']}
    names = dict(model.named_parameters())
    no_decay = [n for n in names if n == 'backbone.alpha' or 'relative_position_bias_table' in n or 'norm' in n]
    assert 'backbone.alpha' in no_decay and any('relative_position_bias_table' in n for n in no_decay)
    assert all(decay[id(names[n])] == 0 for n in no_decay)
    assert decay[id(names['backbone.patch_embed.proj.weight'])] == pytest.approx(0.05)
