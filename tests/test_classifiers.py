"""The ImageNet configs evaluate the official classifiers: an official checkpoint converted with
tools/model_converters/convert.py loads (strictly) into the config's mmpretrain ImageClassifier and reproduces
the official logits. FAN and RMT have their own versions in test_fan_classifier.py / test_rmt.py."""
import importlib
import json
import os.path as osp
from pathlib import Path

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import DefaultScope
from mmengine.runner import load_checkpoint

from conftest import CONFIGS
from mmvisatt.checkpoint import convert_checkpoint_file
from mmvisatt.testing import parity_model

registry = importlib.import_module('mmpretrain.registry')
PARITY = Path(__file__).parent / 'data' / 'parity'


@pytest.mark.parametrize('case, config, family', [
    ('reswin_a', 'imagenet_reswin_t.py', 'reswin'),
    ('revit_a', 'imagenet_revit_b.py', 'revit'),
    ('remvit_a', 'imagenet_remvit_t.py', 'remvit'),
])
def test_imagenet_config_gives_official_logits(case, config, family, tmp_path):
    folder = PARITY / 'revit' / case
    meta = json.loads((folder / 'meta.json').read_text())
    official = torch.load(folder / 'state_dict.pth', map_location='cpu', weights_only=True)
    images = torch.load(folder / 'input.pt', weights_only=True).double()
    ref = torch.load(folder / 'outputs.pt', weights_only=True)['logits']
    tap = parity_model(meta, official)

    cfg = Config.fromfile(osp.join(CONFIGS, config))
    # the fixture's (small) shape inside the config's own backbone: the config's residual mode (the mode the released
    # weights were trained in), head layout, output index and neck stay
    out_indices = cfg.model.backbone.out_indices
    assert tap.backbone.out_indices[tap.pool_index] == out_indices[-1]
    shape = {k: v for k, v in tap.backbone_cfg.items() if k not in ('type', 'residual_mode', 'out_indices')}
    cfg.model.backbone = dict(cfg.model.backbone, **shape, out_indices=out_indices, init_cfg=None)
    cfg.model.head.num_classes = meta['logits_shape'][-1]
    cfg.model.head.in_channels = tap.head.in_features
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        model = registry.MODELS.build(cfg.model)

    torch.save({'model': official}, tmp_path / 'official.pth')
    convert_checkpoint_file(str(tmp_path / 'official.pth'), str(tmp_path / 'converted.pth'), family)
    load_checkpoint(model, str(tmp_path / 'converted.pth'), map_location='cpu', strict=True)
    model.double().eval()
    with torch.no_grad():
        logits = model(images, mode='tensor')
    assert ((logits - ref).abs().max() / ref.abs().max()).item() < 1e-6
