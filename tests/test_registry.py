"""Backbones are registered once, in mmengine's root MODELS, and build by bare name in every task scope."""
import pytest
import torch
from mmengine.registry import MODELS, DefaultScope

import mmvisatt.models  # noqa: F401


@pytest.mark.parametrize('scope', ['mmdet', 'mmseg', 'mmpretrain'])
def test_bare_name_builds_under_each_default_scope(scope):
    lib = pytest.importorskip({'mmdet': 'mmdet.registry', 'mmseg': 'mmseg.registry',
                               'mmpretrain': 'mmpretrain.registry'}[scope])
    cfg = dict(type='ReSwinTransformer', arch=dict(embed_dims=16, depths=(1, 1), num_heads=(1, 2)),
               out_indices=(0, 1))
    with DefaultScope.overwrite_default_scope(scope):
        model = lib.MODELS.build(cfg)
    assert type(model).__name__ == 'ReSwinTransformer'
    outs = model(torch.randn(1, 3, 32, 32))
    assert [o.shape[1] for o in outs] == [16, 32]


def test_registered_in_root_registry():
    assert MODELS.get('ReSwinTransformer') is not None
    assert MODELS.scope == 'mmengine'
