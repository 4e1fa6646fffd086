"""Checkpoints are data. Release files in the shapes the authors publish them (DeiT / RMT ``main.py`` with ``args``
and ``model_ema``, timm's ``CheckpointSaver`` with ``args`` and ``version``, Swin with a yacs ``config``, mmengine's
training checkpoints) load through ``init_cfg`` and the converter without importing what they name; a pickle whose
unpickling would run code is refused by every entry point, which names the file, and the code never runs."""
import argparse
import builtins
import os.path as osp
import sys
import types
from collections import OrderedDict

import numpy as np
import pytest
import torch
from mmengine.logging import MessageHub

from conftest import REPO
from mmvisatt.checkpoint import PickledRecord, UnsafeCheckpointError, load_checkpoint_file
from mmvisatt.models.backbones.evt import EVT
from mmvisatt.models.backbones import ReSwinTransformer
from mmvisatt.models.backbones.rmt import RMT
from mmvisatt.models.backbones.shunted import ShuntedTransformer

RMT_TINY = dict(embed_dims=(16, 32, 32, 64), depths=(1, 1, 1, 1), num_heads=(2, 2, 2, 2),
                decomposed=(True, True, False, False))
SWIN_TINY = dict(embed_dims=16, depths=(1, 1, 1, 1), num_heads=(1, 1, 2, 2))
SHUNTED_TINY = dict(embed_dims=(16, 32, 64, 128), depths=(1, 1, 1, 1), num_heads=(2, 4, 8, 16),
                    mlp_ratios=(2, 2, 2, 2), sr_ratios=(8, 4, 2, 1))


class _Marker:
    """Unpickling this calls ``builtins.open(marker, 'w')``: a file appears if the loader executed the pickle."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return builtins.open, (self.path, 'w')


def _evil(tmp_path, weights: dict) -> tuple:
    path, marker = tmp_path / 'evil.pth', tmp_path / 'EXECUTED'
    torch.save({'state_dict': weights, 'meta': {'note': _Marker(str(marker))}}, path)
    return str(path), marker


def _namespace() -> argparse.Namespace:
    return argparse.Namespace(model='RMT_T3', lr=1e-3, batch_size=128, epochs=300, output_dir='out', distributed=True,
                              mixup=0.8, smoothing=0.1, drop_path=0.1, input_size=224)


def _round_trip(model, path: str, **init) -> torch.nn.Module:
    loaded = type(model)(**init, init_cfg=dict(type='Pretrained', checkpoint=path))
    loaded.init_weights()
    return loaded


def _converts(path: str, tmp_path, family: str) -> None:
    """tools/model_converters/convert.py reads the file and writes a plain mm-style one."""
    sys.path.insert(0, osp.join(REPO, 'tools', 'model_converters'))
    import convert
    out = tmp_path / f'{family}_converted.pth'
    convert.main([path, str(out), '--family', family])
    written = torch.load(out, weights_only=True)
    assert written['meta']['family'] == family and written['state_dict']


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return all(torch.equal(sa[k], sb[k]) for k in sa if not k.startswith('norm'))


def test_deit_rmt_style_release_with_args_and_model_ema(tmp_path):
    """main.py's dict: model, model_ema, optimizer, lr_scheduler, scaler, epoch, max_accuracy and args (Namespace);
    init_cfg takes model_ema (what RMT-S/B/L report), the converter reads it too."""
    torch.manual_seed(0)
    model, ema = RMT(arch=RMT_TINY), RMT(arch=RMT_TINY)
    model.init_weights()
    ema.init_weights()
    release = {'model': {k: v for k, v in model.state_dict().items() if not k.startswith('norm')},
               'model_ema': {k: v for k, v in ema.state_dict().items() if not k.startswith('norm')},
               'optimizer': {'state': {}, 'param_groups': [{'lr': 1e-5, 'params': [0, 1]}]},
               'lr_scheduler': {'last_epoch': 299, 'base_values': [1e-3]}, 'scaler': {'scale': 65536.0},
               'epoch': 299, 'max_accuracy': np.float64(82.41), 'args': _namespace()}
    path = str(tmp_path / 'rmt_release.pth')
    torch.save(release, path)
    raw = load_checkpoint_file(path)
    assert isinstance(raw['args'], PickledRecord) and raw['args'].model == 'RMT_T3' and raw['args'].lr == 1e-3
    assert 'argparse.Namespace' in repr(raw['args'])
    assert raw['max_accuracy'] == pytest.approx(82.41)
    assert _same(_round_trip(model, path, arch=RMT_TINY), ema)
    _converts(path, tmp_path, 'rmt')


def test_timm_checkpoint_saver_file_with_args_and_version(tmp_path):
    """timm's CheckpointSaver: epoch, arch, state_dict, optimizer, version, args, metric, state_dict_ema; the way
    Shunted and FAN (``*.pth.tar``) files come."""
    torch.manual_seed(0)
    model = ShuntedTransformer(arch=SHUNTED_TINY)
    model.init_weights()
    weights = model.state_dict()
    saved = {'epoch': 299, 'arch': 'shunted_t', 'state_dict': weights, 'optimizer': {'state': {}, 'param_groups': []},
             'version': 2, 'args': _namespace(), 'metric': 79.8, 'state_dict_ema': weights}
    path = str(tmp_path / 'model_best.pth.tar')
    torch.save(saved, path)
    assert load_checkpoint_file(path)['version'] == 2
    assert _same(_round_trip(model, path, arch=SHUNTED_TINY), model)
    _converts(path, tmp_path, 'shunted')


def test_swin_style_file_with_a_yacs_config(tmp_path, monkeypatch):
    """Swin's main.py saves its yacs CfgNode as ``config``: read as a plain dict without importing yacs."""
    yacs, config_module = types.ModuleType('yacs'), types.ModuleType('yacs.config')

    class CfgNode(dict):
        pass

    CfgNode.__module__, CfgNode.__qualname__ = 'yacs.config', 'CfgNode'
    config_module.CfgNode = CfgNode
    monkeypatch.setitem(sys.modules, 'yacs', yacs)
    monkeypatch.setitem(sys.modules, 'yacs.config', config_module)
    cfg = CfgNode(MODEL=CfgNode(TYPE='swin', NAME='swin_tiny_patch4_window7_224'), TRAIN=CfgNode(BASE_LR=1e-3))
    cfg.__dict__['_immutable'] = True
    model = ReSwinTransformer(arch=SWIN_TINY)
    model.init_weights()
    weights = {k: v for k, v in model.state_dict().items() if not k.startswith(('norm0', 'norm1', 'norm2', 'alpha'))}
    path = str(tmp_path / 'swin_release.pth')
    torch.save({'model': weights, 'optimizer': {}, 'lr_scheduler': {}, 'max_accuracy': 81.2, 'scaler': {},
                'epoch': 299, 'config': cfg}, path)
    monkeypatch.delitem(sys.modules, 'yacs.config')
    monkeypatch.delitem(sys.modules, 'yacs')
    raw = load_checkpoint_file(path)
    assert type(raw['config']) is OrderedDict and raw['config']['MODEL']['TYPE'] == 'swin'
    assert 'yacs' not in sys.modules
    assert _same(_round_trip(model, path, arch=SWIN_TINY), model)
    _converts(path, tmp_path, 'reswin')


def test_mmengine_training_checkpoint(tmp_path):
    """What mmengine's CheckpointHook writes (meta with numpy values, the message hub's HistoryBuffers, optimizer
    state): ``--resume`` reads it, and init_cfg takes its backbone."""
    torch.manual_seed(0)
    model = EVT(arch=dict(RMT_TINY, full_attention=(False, False, False, True)))
    model.init_weights()
    hub = MessageHub.get_instance('safe_load_test')
    for i in range(3):
        hub.update_scalar('train/loss', 1.0 / (i + 1))
    saved = {'meta': {'epoch': 1, 'iter': 3, 'seed': np.int64(0), 'eta': np.float64(12.5)},
             'state_dict': {'backbone.' + k: v for k, v in model.state_dict().items()},
             'message_hub': hub.state_dict(), 'optimizer': {'state': {}, 'param_groups': []}}
    path = str(tmp_path / 'epoch_1.pth')
    torch.save(saved, path)
    raw = load_checkpoint_file(path)
    assert raw['message_hub']['log_scalars']['train/loss'].mean() == pytest.approx((1 + 1 / 2 + 1 / 3) / 3)
    loaded = _round_trip(model, path, arch=dict(RMT_TINY, full_attention=(False, False, False, True)))
    assert _same(loaded, model)
    _converts(path, tmp_path, 'evt')


def test_a_home_relative_path_is_expanded(tmp_path, monkeypatch):
    monkeypatch.setenv('HOME', str(tmp_path))
    torch.save({'w': torch.ones(2)}, tmp_path / 'weights.pth')
    assert torch.equal(load_checkpoint_file('~/weights.pth')['w'], torch.ones(2))
    from mmvisatt.checkpoint import read_checkpoint
    assert torch.equal(read_checkpoint('~/weights.pth')['w'], torch.ones(2))


# ----------------------------------------------------------------------------------------- a malicious file

def _refused(error, path, marker) -> None:
    text = str(error)
    assert path in text, text
    assert 'io.open' in text and 'was refused before anything in it was imported or executed' in text, text
    assert 'weights_only=False' not in text and 'weights_only' not in text, text
    assert 'torch.save(model.state_dict()' in text, text
    assert not marker.exists(), 'the pickle was executed'


def test_the_loader_and_init_cfg_refuse_it(tmp_path):
    model = RMT(arch=RMT_TINY)
    path, marker = _evil(tmp_path, {'backbone.' + k: v for k, v in model.state_dict().items()})
    with pytest.raises(UnsafeCheckpointError) as error:
        load_checkpoint_file(path)
    _refused(error.value, path, marker)
    with pytest.raises(UnsafeCheckpointError) as error:
        _round_trip(model, path, arch=RMT_TINY)
    _refused(error.value, path, marker)
    from mmengine.runner import load_checkpoint
    with pytest.raises(UnsafeCheckpointError) as error:
        load_checkpoint(model, path, map_location='cpu')
    _refused(error.value, path, marker)


def test_the_converter_refuses_it(tmp_path):
    path, marker = _evil(tmp_path, {'w': torch.ones(1)})
    sys.path.insert(0, osp.join(REPO, 'tools', 'model_converters'))
    import convert
    with pytest.raises(SystemExit) as error:
        convert.main([path, str(tmp_path / 'out.pth')])
    _refused(error.value.code, path, marker)


def test_train_and_test_tools_refuse_it(tiny_det_config, tmp_path):
    """tools/test.py CHECKPOINT, tools/train.py --resume, load_from and the corruption benchmark: the message, before
    any model runs."""
    from mmvisatt.engine import entrypoints
    from mmvisatt.robustness.benchmark import main as robustness_main
    path, marker = _evil(tmp_path, {'w': torch.ones(1)})
    runs = [
        lambda: entrypoints.run_tool(entrypoints.test_main, [tiny_det_config, path, '--demo', '--work-dir',
                                                             str(tmp_path / 'test')]),
        lambda: entrypoints.run_tool(entrypoints.train_main, [tiny_det_config, '--demo', '--resume', path,
                                                              '--work-dir', str(tmp_path / 'resume')]),
        lambda: entrypoints.run_tool(entrypoints.train_main, [tiny_det_config, '--demo', '--work-dir',
                                                              str(tmp_path / 'load_from'), '--cfg-options',
                                                              f'load_from={path}', 'train_cfg.max_iters=1']),
        lambda: entrypoints.run_tool(robustness_main, [tiny_det_config, path, '--demo', '--corruptions', 'fog',
                                                       '--severities', '1', '--out-dir', str(tmp_path / 'robust')]),
    ]
    for run in runs:
        with pytest.raises(SystemExit) as error:
            run()
        _refused(error.value.code, path, marker)


def test_infer_export_and_analysis_tools_refuse_it(tiny_det_config, tmp_path):
    path, marker = _evil(tmp_path, {'w': torch.ones(1)})
    image = tmp_path / 'images'
    image.mkdir()
    import cv2
    cv2.imwrite(str(image / 'a.png'), np.zeros((64, 64, 3), np.uint8))
    from mmvisatt.apis.inference import run_infer_tool
    with pytest.raises(SystemExit) as error:
        run_infer_tool([str(image), tiny_det_config, path, '--out', str(tmp_path / 'out'), '--device', 'cpu',
                        '--demo'])
    _refused(error.value.code, path, marker)
    sys.path.insert(0, osp.join(REPO, 'tools', 'deployment'))
    import export_onnx
    with pytest.raises(SystemExit) as error:
        export_onnx.main([tiny_det_config, path, '--shape', '64', '64', '--out', str(tmp_path / 'x.onnx')])
    _refused(error.value.code, path, marker)
    from mmvisatt.analysis.cli import model_summary_main, run
    with pytest.raises(SystemExit) as error:
        run(model_summary_main, ['ReSwinTransformer:t', path])
    _refused(error.value.code, path, marker)


def test_no_weights_only_false_anywhere():
    """No code path of the package or its tools turns torch's check off."""
    import subprocess
    found = subprocess.run(['grep', '-rn', '--include=*.py', 'weights_only=False', 'mmvisatt', 'tools'], cwd=REPO,
                           capture_output=True, text=True).stdout
    assert found == '', found


def test_configs_dicts_and_paths_are_plain_data(tmp_path):
    """An mmengine ConfigDict and a pathlib path in a file are read as a dict and a string."""
    import pathlib
    from mmengine.config import ConfigDict
    torch.save({'cfg': ConfigDict(a=1, b=dict(c=2)), 'dir': pathlib.PurePosixPath('/data/imagenet')},
               tmp_path / 'x.pth')
    raw = load_checkpoint_file(str(tmp_path / 'x.pth'))
    assert raw['cfg']['b']['c'] == 2 and raw['dir'] == '/data/imagenet'
