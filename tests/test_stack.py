"""The two OpenMMLab stacks: ``import mmvisatt`` accepts upstream's last releases or the onedl fork and stops on
anything else, naming what was found, what is accepted and the fix; requirements/ states the same ranges."""
import os
import os.path as osp
import subprocess
import sys

import pytest

from conftest import REPO
from mmvisatt import stack

UPSTREAM = dict(mmcv='2.1.0', mmengine='0.10.7', mmdet='3.3.0', mmsegmentation='1.2.2', mmpretrain='1.2.0')
FORK = {'onedl-mmcv': '2.3.6', 'onedl-mmengine': '0.10.12', 'onedl-mmdetection': '3.5.1',
        'onedl-mmsegmentation': '1.4.2', 'onedl-mmpretrain': '1.3.6'}


def _dists(**found):
    dists = {lib.dist: None for libs in stack.STACKS.values() for lib in libs.values()}
    dists.update(found)
    return dists


def test_either_whole_stack_is_supported():
    assert stack.stack_problems(dict(mmcv='2.1.0', mmengine='0.10.7'), _dists(**UPSTREAM)) == []
    assert stack.stack_problems(dict(mmcv='2.3.6', mmengine='0.10.12'), _dists(**FORK)) == []
    # a source checkout of mmcv on PYTHONPATH has no distribution; its version decides
    assert stack.stack_problems(dict(mmcv='2.1.0', mmengine='0.10.7'), _dists()) == []
    assert stack.stack_of(_dists(**UPSTREAM)) == 'openmmlab' and stack.stack_of(_dists(**FORK)) == 'onedl'
    assert stack.stack_of(_dists(mmcv='2.1.0', **{'onedl-mmcv': '2.3.6'})) == 'mixed'


@pytest.mark.parametrize('imported, dists, expected', [
    (dict(mmcv='2.2.0', mmengine='0.10.7'), dict(mmcv='2.2.0'),
     'mmcv 2.2.0 is installed; accepted: mmcv>=2.0.0,<2.2.0 (upstream OpenMMLab) or onedl-mmcv>=2.3.0,<2.4.0 (the '
     'onedl fork)'),
    (dict(mmcv='2.3.6', mmengine='0.10.12'), dict(FORK, mmdet='3.3.0', **{'onedl-mmdetection': None}),
     'mmdet 3.3.0 (upstream OpenMMLab) is installed beside mmcv 2.3.6 (the onedl fork); with it use '
     'onedl-mmdetection>=3.5.0,<3.6.0'),
    (dict(mmcv='2.1.0', mmengine='0.9.1'), dict(mmcv='2.1.0', mmengine='0.9.1'),
     'mmengine 0.9.1 is installed beside mmcv 2.1.0 (upstream OpenMMLab); accepted: mmengine>=0.10.0,<1.0.0'),
    (dict(mmcv='2.1.0', mmengine='0.10.7'), dict(UPSTREAM, mmdet='3.2.0'),
     'mmdet 3.2.0 is installed; accepted: mmdet>=3.3.0,<3.4.0'),
    (dict(mmcv='2.1.0', mmengine='0.10.7'), dict(UPSTREAM, **{'onedl-mmcv': '2.3.6'}),
     'both mmcv 2.1.0 and onedl-mmcv 2.3.6 are installed: they write the same files'),
    (dict(mmcv=None, mmengine='0.10.7'), {},
     'mmcv cannot be imported: this package needs mmcv (mmcv>=2.0.0,<2.2.0 (upstream OpenMMLab) or '
     'onedl-mmcv>=2.3.0,<2.4.0 (the onedl fork))'),
])
def test_what_is_not_supported_is_named_with_what_is(imported, dists, expected):
    problems = stack.stack_problems(imported, _dists(**dists))
    assert any(p.startswith(expected) for p in problems), problems


def test_importing_the_package_stops_on_an_unsupported_mmcv(tmp_path):
    """mmcv 2.2.0 (which mmdet 3.3 refuses at its own import) in front of the installed one."""
    fake = tmp_path / 'mmcv'
    fake.mkdir()
    (fake / '__init__.py').write_text("__version__ = '2.2.0'\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), REPO]))
    run = subprocess.run([sys.executable, '-c', 'import mmvisatt'], env=env, capture_output=True, text=True,
                         cwd=str(tmp_path))
    assert run.returncode == 1
    last = run.stderr.strip().splitlines()
    assert 'mmvisatt.stack.UnsupportedStackError: mmvisatt cannot run on the installed OpenMMLab stack:' in run.stderr
    assert '- mmcv 2.2.0 is installed; accepted: mmcv>=2.0.0,<2.2.0' in run.stderr
    assert last[-1].startswith('Fix: tools/setup_env.sh installs either stack')


@pytest.mark.parametrize('name, key', [('mminstall.txt', 'openmmlab'), ('onedl.txt', 'onedl')])
def test_the_requirements_state_the_supported_ranges(name, key):
    with open(osp.join(REPO, 'requirements', name)) as f:
        lines = {line.split('#')[0].strip() for line in f} - {''}
    assert {lib.requirement() for lib in stack.STACKS[key].values()} <= lines
    with open(osp.join(REPO, 'requirements', 'runtime.txt')) as f:
        runtime = f.read()
    assert not [lib.dist for libs in stack.STACKS.values() for lib in libs.values()
                if f'\n{lib.dist}' in '\n' + runtime.replace(' ', '')]
