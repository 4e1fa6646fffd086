"""Numerical parity with the official implementations (fixtures produced by running the official code)."""
import json
from pathlib import Path

import pytest
import torch

from mmvisatt.testing import parity_model

PARITY = Path(__file__).parent / 'data' / 'parity'
CASES = sorted(p.parent for p in PARITY.glob('*/*/meta.json'))


def relative_error(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return ((ours - ref).abs().max() / ref.abs().max()).item()


@pytest.mark.parametrize('fused_attn', [False, True], ids=['reference', 'fused'])
@pytest.mark.parametrize('case', CASES, ids=[f'{c.parent.name}/{c.name}' for c in CASES])
def test_parity(case, fused_attn):
    meta = json.loads((case / 'meta.json').read_text())
    state_dict = torch.load(case / 'state_dict.pth', map_location='cpu', weights_only=True)
    images = torch.load(case / 'input.pt', weights_only=True)
    ref = torch.load(case / 'outputs.pt', weights_only=True)

    model = parity_model(meta, state_dict, fused_attn).double()
    with torch.no_grad():
        out = model(images.double())

    assert len(out['stages']) == len(ref['stages']) == len(meta['stage_points'])
    for i, (ours, theirs) in enumerate(zip(out['stages'], ref['stages'])):
        assert tuple(ours.shape) == tuple(theirs.shape) == tuple(meta['stage_shapes'][i])
        assert relative_error(ours, theirs) < 1e-6, f'stage {i} ({meta["stage_points"][i]})'
    if 'logits_shape' in meta:
        assert tuple(out['logits'].shape) == tuple(meta['logits_shape'])
        assert relative_error(out['logits'], ref['logits']) < 1e-6


def test_parity_detects_a_wrong_residual():
    """The fixtures are sensitive to the residual path: dropping it must break parity (the test can fail)."""
    case = PARITY / 'revit' / 'reswin_a'
    meta = json.loads((case / 'meta.json').read_text())
    state_dict = torch.load(case / 'state_dict.pth', map_location='cpu', weights_only=True)
    images = torch.load(case / 'input.pt', weights_only=True)
    ref = torch.load(case / 'outputs.pt', weights_only=True)
    model = parity_model(meta, state_dict).double()
    for block in model.backbone.modules():
        if hasattr(block, 'align'):
            block.align = lambda prev, grid, batch, heads: (None, None)
    with torch.no_grad():
        out = model(images.double())
    assert relative_error(out['stages'][-1], ref['stages'][-1]) > 1e-3
