"""ONNX export (mmvisatt.deployment, tools/deployment/export_onnx.py): every backbone form exports with torch's
current exporter and equals eager PyTorch in onnxruntime; the forms that allow it with dynamic height and width."""
import os.path as osp
import sys

import pytest
import torch

from mmvisatt.deployment import (TOLERANCE, BackboneWithNeck, ExportError, build_export_model, check_sizes,
                                 export_onnx)
from mmvisatt.testing.cases import TINY_CASES, build

pytest.importorskip('onnxruntime')
pytest.importorskip('onnxscript')

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
sys.path.insert(0, osp.join(REPO, 'tools', 'deployment'))

# forms whose height and width export as dynamic dimensions (docs/deployment.md says why the others do not)
DYNAMIC = ['rmt', 'shunted', 'fan_vit', 'fan_hybrid', 'revit', 'remvit']
STATIC = [name for name in TINY_CASES if name not in DYNAMIC]
SIZE = (96, 128)


# forms with position tables laid out for one input size (img_size) and resized for others
POSITION_TABLES = ['revit', 'remvit']


def _model(name: str, **extra) -> BackboneWithNeck:
    typ, kwargs = TINY_CASES[name]
    return BackboneWithNeck(build(typ, **kwargs, **extra)).eval()


def test_check_sizes_avoid_strides_and_windows():
    for h, w in check_sizes(224, 320) + check_sizes(800, 1216) + check_sizes(64, 96):
        assert h % 2 and w % 2 and h % 7 and w % 7


@pytest.mark.parametrize('name', DYNAMIC)
def test_dynamic_export_matches_eager_at_three_sizes(name, tmp_path):
    # tables laid out for the export height: a resize skipped there by an `if` on the sizes would have fixed the
    # graph to the export size (as it did at 224x224 for img_size 224)
    extra = dict(img_size=SIZE[0]) if name in POSITION_TABLES else {}
    result = export_onnx(_model(name, **extra), str(tmp_path / f'{name}.onnx'), *SIZE, dynamic=True)
    assert result.dynamic and result.static_reason is None, result.static_reason
    assert [hw for hw, _ in result.errors] == [SIZE] + check_sizes(*SIZE)
    assert all(err < TOLERANCE for _, err in result.errors)


@pytest.mark.parametrize('name', STATIC)
def test_static_forms_say_why_and_match_at_the_export_size(name, tmp_path):
    """Asked for dynamic shapes, the window / group forms export static and say why."""
    model = _model(name)
    result = export_onnx(model, str(tmp_path / f'{name}.onnx'), *SIZE, dynamic=True)
    assert not result.dynamic and result.static_reason == model.backbone.static_export_reason
    assert 'cannot be dynamic' in result.line(name)
    assert [hw for hw, _ in result.errors] == [SIZE] and result.errors[0][1] < TOLERANCE


class _SplitsBySize(torch.nn.Module):
    """Python arithmetic on the input size, as the window and group layouts do."""

    def __init__(self, how: str):
        super().__init__()
        self.how = how

    def forward(self, image):
        if self.how == 'divmod':
            rows, _ = divmod(image.shape[2], 7)  # symbolic sizes have no divmod: the exporter fails
            return (image[:, :, :rows * 7] * 2, )
        if image.shape[3] == 80:  # a branch on the exact size: the exporter fixes the width
            return (image + 1, )
        return (image * 2, )


@pytest.mark.parametrize('how,why', [('divmod', 'the exporter failed with TypeError'),
                                     ('branch', 'the exporter fixed them to the export size')])
def test_a_model_that_cannot_be_dynamic_is_exported_static(how, why, tmp_path):
    result = export_onnx(_SplitsBySize(how), str(tmp_path / 'm.onnx'), 70, 80, dynamic=True)
    assert not result.dynamic and result.static_reason.startswith(why)
    assert [hw for hw, _ in result.errors] == [(70, 80)] and result.errors[0][1] == 0


def test_a_wrong_graph_is_an_error(tmp_path, monkeypatch):
    """The check can fail: an exported graph that differs from the eager model is refused."""
    import mmvisatt.deployment as deployment
    model = _model('fan_vit')
    real = deployment.compare

    def perturbed(path, module, sizes, seed=0):
        with torch.no_grad():
            next(module.parameters()).add_(0.1)
        return real(path, module, sizes, seed)

    monkeypatch.setattr(deployment, 'compare', perturbed)
    with pytest.raises(ExportError, match='differs from eager'):
        export_onnx(model, str(tmp_path / 'm.onnx'), *SIZE)


def _tiny_detector_config(tmp_path) -> str:
    path = tmp_path / 'tiny_reswin_mask_rcnn.py'
    path.write_text(f"_base_ = [{osp.join(REPO, 'configs', 'mask_rcnn_reswin_t_1x.py')!r}]\n"
                    "model = dict(backbone=dict(arch=dict(_delete_=True, embed_dims=16, depths=(2, 2, 2, 2),\n"
                    "                                     num_heads=(1, 2, 4, 8))),\n"
                    "             neck=dict(in_channels=[16, 32, 64, 128], out_channels=32))\n")
    return str(path)


def test_tool_exports_backbone_and_neck_with_a_trained_checkpoint(tmp_path, capsys):
    import export_onnx as tool
    config = _tiny_detector_config(tmp_path)
    trained = build_export_model(config, with_neck=True)
    state = {f'{part}.{k}': v for part in ('backbone', 'neck') for k, v in getattr(trained, part).state_dict().items()}
    torch.save({'state_dict': state, 'meta': {}}, tmp_path / 'epoch_12.pth')
    result = tool.main([config, str(tmp_path / 'epoch_12.pth'), '--shape', *map(str, SIZE), '--with-neck'])
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith('tiny_reswin_mask_rcnn (ReSwinTransformer + FPN) -> ') and 'relative error' in line
    assert result.path == str(tmp_path / 'tiny_reswin_mask_rcnn_neck.onnx') and osp.isfile(result.path)
    # the exported weights are the checkpoint's: the graph matches the trained modules, not a fresh initialisation
    from mmvisatt.deployment import compare
    assert compare(result.path, trained, [SIZE])[0] < TOLERANCE


def test_tool_errors_name_the_problem(tmp_path):
    import export_onnx as tool
    config = _tiny_detector_config(tmp_path)
    backbone_only = build_export_model(config).backbone.state_dict()
    torch.save({'state_dict': {f'backbone.{k}': v for k, v in backbone_only.items()}}, tmp_path / 'bb.pth')
    with pytest.raises(SystemExit, match="no 'neck.' weights"):
        tool.main([config, str(tmp_path / 'bb.pth'), '--shape', '64', '96', '--with-neck'])
    with pytest.raises(SystemExit, match='has no neck'):
        tool.main([osp.join(REPO, 'configs', 'upernet_reswin_t_160k_ade20k.py'), '--shape', '64', '96', '--with-neck'])


def test_remvit_as_its_configs_build_it_exports(tmp_path):
    # the ReMViTv2 configs set score_memory='handoff': the export switches to the reference, the same scores
    model = _model('remvit', img_size=SIZE[0], score_memory='handoff')
    result = export_onnx(model, str(tmp_path / 'remvit.onnx'), *SIZE, dynamic=True)
    assert result.dynamic and all(err < TOLERANCE for _, err in result.errors)
    assert {m.score_memory for m in model.modules() if hasattr(m, 'score_memory')} == {'full'}
