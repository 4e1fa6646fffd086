"""Packaged like an OpenMMLab project: the model index covers every config, a wheel carries ``mmvisatt/.mim``
(configs, tools, model-index.yml), and with that wheel installed (not editable) its configs load and openmim finds
them: ``mim search mmvisatt`` lists the models and ``mim train mmvisatt CONFIG --demo`` trains."""
import json
import os
import os.path as osp
import re
import shutil
import subprocess
import sys
import zipfile

import pytest
import yaml

from conftest import CONFIGS, REPO
from mmvisatt.metafiles import FAMILIES, metafiles
from mmvisatt.task_configs import expected_configs

MIM = osp.join(osp.dirname(sys.executable), 'mim')


def test_model_index_is_the_generated_one():
    for path, text in metafiles(CONFIGS, osp.join(REPO, 'docs', 'model_zoo.json')).items():
        with open(osp.join(REPO, path)) as f:
            assert f.read() == text, f'{path}: run tools/misc/generate_configs.py'


def test_model_index_lists_every_config_once_with_its_numbers():
    with open(osp.join(REPO, 'model-index.yml')) as f:
        index = yaml.safe_load(f)
    assert len(index['Import']) == len(FAMILIES)
    models = []
    for path in index['Import']:
        with open(osp.join(REPO, path)) as f:
            models += yaml.safe_load(f)['Models']
    names = [m['Name'] for m in models]
    assert sorted(names) == sorted(name[:-3] for name in expected_configs(CONFIGS))
    with open(osp.join(REPO, 'docs', 'model_zoo.json')) as f:
        zoo = json.load(f)['configs']
    for model in models:
        assert osp.isfile(osp.join(REPO, model['Config'])), model['Config']
        assert model['Metadata']['Parameters'] == zoo[model['Name']]['params']
    by_name = {m['Name']: m for m in models}
    # a reported result with its source, and an official release as an ImageNet classifier's weights
    rmt = by_name['mask_rcnn_rmt_t_1x']
    assert {r['Task'] for r in rmt['Results']} == {'Object Detection', 'Instance Segmentation'}
    assert 'RMT paper' in rmt['Results source']
    assert by_name['imagenet_fan_vit_t']['Weights'].startswith('https://github.com/zhoudaquan/')
    assert 'Weights' not in by_name['imagenet_evt_t']  # no official EVT weights exist


@pytest.fixture(scope='module')
def installed_wheel(tmp_path_factory):
    """The wheel of a copy of the repository (as pip builds it from an sdist checkout), installed with
    ``pip --target`` into a folder that goes first on PYTHONPATH; returns (the wheel, the environment)."""
    tmp = tmp_path_factory.mktemp('wheel')
    src = tmp / 'src'
    src.mkdir()
    for item in ('setup.py', 'README.md', 'model-index.yml', 'requirements', 'mmvisatt', 'configs', 'tools'):
        copy = shutil.copytree if osp.isdir(osp.join(REPO, item)) else shutil.copy
        kwargs = dict(ignore=shutil.ignore_patterns('__pycache__', '.mim', '*.egg-info')) if copy is shutil.copytree \
            else {}
        copy(osp.join(REPO, item), src / item, **kwargs)
    (src / 'docs').mkdir()
    shutil.copy(osp.join(REPO, 'docs', 'config_memory.json'), src / 'docs')
    pip = [sys.executable, '-m', 'pip', '--disable-pip-version-check']
    subprocess.run(pip + ['wheel', '-q', '--no-deps', '--no-build-isolation', '-w', str(tmp / 'dist'), str(src)],
                   check=True, capture_output=True, text=True)
    wheel, = (tmp / 'dist').glob('mmvisatt-*.whl')
    site = tmp / 'site'
    subprocess.run(pip + ['install', '-q', '--no-deps', '--target', str(site), str(wheel)], check=True,
                   capture_output=True, text=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site)] + [p for p in [os.environ.get('PYTHONPATH')] if p]))
    return wheel, env, tmp


def test_wheel_carries_configs_tools_and_the_index(installed_wheel):
    wheel, env, _ = installed_wheel
    names = set(zipfile.ZipFile(wheel).namelist())
    for path in ('mmvisatt/.mim/model-index.yml', 'mmvisatt/.mim/configs/mask_rcnn_reswin_t_3x.py',
                 'mmvisatt/.mim/configs/_base_/backbones/reswin_t.py', 'mmvisatt/.mim/configs/metafiles/rmt.yml',
                 'mmvisatt/.mim/tools/train.py', 'mmvisatt/.mim/tools/analysis/get_flops.py',
                 'mmvisatt/.mim/docs/config_memory.json'):
        assert path in names, path
    assert len([n for n in names if n.startswith('mmvisatt/.mim/configs/') and n.endswith('.py')]) > len(
        expected_configs(CONFIGS))
    # the installed copy, not the checkout, is what Python finds; its configs load with their bases
    tmp = installed_wheel[2]
    code = ('import mmvisatt, os.path as osp; from mmengine.config import Config; '
            'root = osp.dirname(mmvisatt.__file__); print(root); '
            "print(Config.fromfile(osp.join(root, '.mim/configs/mask_rcnn_reswin_t_3x.py')).model.backbone.type); "
            'from mmvisatt.engine.preflight.memory import table_path; print(table_path())')
    out = subprocess.run([sys.executable, '-c', code], env=env, cwd=str(tmp), capture_output=True, text=True,
                         check=True).stdout.split()
    assert out[0] == str(tmp / 'site' / 'mmvisatt') and out[1] == 'ReSwinTransformer'
    # the pre-flight's memory table travels with the package
    assert out[2] == str(tmp / 'site' / 'mmvisatt' / '.mim' / 'docs' / 'config_memory.json')


@pytest.mark.skipif(not osp.exists(MIM), reason='openmim is not installed (tools/setup_env.sh installs it)')
def test_mim_search_lists_the_models(installed_wheel):
    _, env, tmp = installed_wheel
    out = subprocess.run([MIM, 'search', 'mmvisatt', '--config', 'mask_rcnn_reswin_t_3x', '--field', 'config',
                          'training_data', 'epochs', 'parameters'], env=env, cwd=str(tmp), capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert 'config id: mask_rcnn_reswin_t_3x' in out.stdout and 'training_data  coco' in out.stdout.lower()
    assert re.search(r'parameters\s+47794602', out.stdout), out.stdout  # ReSwin-T Mask R-CNN, from the index


@pytest.mark.slow
@pytest.mark.skipif(not osp.exists(MIM), reason='openmim is not installed (tools/setup_env.sh installs it)')
def test_mim_train_runs_the_demo(installed_wheel):
    _, env, tmp = installed_wheel
    work_dir = tmp / 'mim_demo'
    proc = subprocess.run([MIM, 'train', 'mmvisatt', 'mask_rcnn_reswin_t_3x.py', '--demo', '--work-dir', str(work_dir),
                           '--cfg-options', 'train_cfg.max_iters=2', 'val_dataloader.dataset.indices=2',
                           'visualizer.name=mim_demo'], env=env, cwd=str(tmp), capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert osp.isfile(work_dir / 'iter_2.pth')
    assert 'mmvisatt/.mim/configs/mask_rcnn_reswin_t_3x.py' in proc.stdout + proc.stderr


#: distributions an environment of each stack holds: what this package's requirements need, by their metadata
STACK_ENVIRONMENTS = {
    'openmmlab': dict(mmcv='2.1.0', mmengine='0.10.7', mmdet='3.3.0', mmsegmentation='1.2.2', mmpretrain='1.2.0'),
    'onedl': {'onedl-mmcv': '2.3.6', 'onedl-mmengine': '0.10.12', 'onedl-mmdetection': '3.5.1',
              'onedl-mmsegmentation': '1.4.2', 'onedl-mmpretrain': '1.3.6'},
}
BESIDE = dict(torch='2.14.1', timm='1.0.20', numpy='2.3.0', pycocotools='2.0.10', pillow='11.3.0',
              matplotlib='3.10.0', pyyaml='6.0.2', ftfy='6.3.1', regex='2025.9.1')


@pytest.mark.parametrize('stack, extra', [('onedl', ''), ('onedl', '[onedl]'), ('openmmlab', '[mim]')])
def test_installing_the_wheel_into_either_stack_installs_nothing_else(installed_wheel, tmp_path, stack, extra):
    """pip's resolution (a dry run, offline) of this package into an environment that holds one stack's
    distributions (their metadata is all the resolver reads): it installs this package alone. With the fork, no
    upstream mmcv is built over the fork's files."""
    wheel = installed_wheel[0]
    env = tmp_path / 'env'
    subprocess.run([sys.executable, '-m', 'venv', '--without-pip', str(env)], check=True)
    site, = env.glob('lib/python*/site-packages')
    for name, version in dict(BESIDE, **STACK_ENVIRONMENTS[stack]).items():
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / 'METADATA').write_text(f'Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n')
    run = subprocess.run([sys.executable, '-m', 'pip', '--python', str(env / 'bin' / 'python'), 'install',
                          '--dry-run', '--no-index', '--disable-pip-version-check', '--quiet', '--report', '-',
                          f'{wheel}{extra}'], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert [item['metadata']['name'] for item in json.loads(run.stdout)['install']] == ['mmvisatt']


def test_setup_says_when_the_disk_is_too_small_for_torch(tmp_path):
    """Before installing torch (6.7 GB of venv with its CUDA build), set-up checks the free space and names the
    problem and the fix, instead of pip's ``[Errno 28] No space left on device`` half-way through."""
    env = dict(os.environ, MMVISATT_VENV=str(tmp_path / 'venv'), MMVISATT_CACHE=str(tmp_path / 'cache'),
               MMVISATT_NEED_GB='1000000000')
    run = subprocess.run(['bash', osp.join(REPO, 'tools', 'setup_env.sh')], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 1, run.stderr
    assert re.search(r'only \d+ GB free on the disk of .*venv: torch 2\.14\.1 .* point MMVISATT_VENV at a larger '
                     r'disk', run.stderr), run.stderr
    assert not osp.exists(tmp_path / 'venv' / 'lib' / f'python{sys.version_info[0]}.{sys.version_info[1]}'
                          / 'site-packages' / 'torch')


def test_the_package_imports_no_benchmark():
    """The development bench (timers, suites, the allocator re-exec) lives in tools/, beside the package."""
    import subprocess
    import sys
    code = ('import sys, mmvisatt, mmvisatt.analysis, mmvisatt.models, mmvisatt.engine; '
            'print(sorted(m for m in sys.modules if m.split(".")[-1] in ("benchmark", "decay_kernels", '
            '"fast_path_ratios")))')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == '[]', out
