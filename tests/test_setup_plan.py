"""What the set-up installs and builds on the machines users have (tools/setup_plan.py decides, setup_env.sh acts),
and that installing this package into an environment that holds the stack changes none of it."""
import importlib.util
import json
import os
import os.path as osp
import subprocess
import sys

import pytest

from conftest import REPO

_spec = importlib.util.spec_from_file_location('setup_plan', osp.join(REPO, 'tools', 'setup_plan.py'))
setup_plan = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(setup_plan)
SETUP = osp.join(REPO, 'tools', 'setup_env.sh')


def _probe(torch=None, cuda=None, gpus=(), mmcv=None, ops=None, **packages):
    names = {name: None for name in setup_plan.PACKAGES}
    names.update(torch=torch, torchvision=torch and '0.x', mmcv=mmcv, **packages)
    return dict(python='3.11', prefix='/env', packages=names, torch_cuda=cuda, gpus=list(gpus), mmcv_ops=ops,
                free_gb=100)


def _plan(probe, tmp_path, env=None, **kwargs):
    kwargs.setdefault('jobs', 16)
    return setup_plan.make_plan(probe, env or {}, str(tmp_path / 'cache'), **kwargs)


def _cache_wheel(tmp_path, key):
    folder = tmp_path / 'cache' / 'wheels' / key
    folder.mkdir(parents=True)
    wheel = folder / 'mmcv-2.1.0-cp311-cp311-linux_x86_64.whl'
    wheel.write_bytes(b'')
    return str(wheel)


def test_a_fresh_cpu_machine_gets_torch_and_mmcv_with_cpu_ops(tmp_path):
    plan = _plan(_probe(), tmp_path, fresh=True)
    assert plan.error is None
    assert plan.vars['install_torch'] == '1'
    # torch from PyPI is a CUDA build; without a GPU, nvcc or FORCE_CUDA the ops are the CPU's
    assert plan.vars['mmcv'] == 'build' and plan.vars['force_cuda'] == '0' and plan.vars['arch_list'] == ''
    assert plan.vars['mmcv_key'] == 'torch2.14.1-cpu' and plan.vars['max_jobs'] == '16'
    assert plan.vars['dev_tools'] == '1'
    text = plan.text()
    assert 'create the virtual environment' in text and 'install torch 2.14.1 + torchvision 0.29.1' in text
    assert 'CPU-only ops' in text and 'set FORCE_CUDA=1 with CUDA_HOME' in text


def test_an_existing_cpu_torch_is_kept_and_mmcv_built_for_it(tmp_path):
    plan = _plan(_probe(torch='2.7.1+cpu'), tmp_path)
    assert 'install_torch' not in plan.vars
    assert plan.vars['mmcv_key'] == 'torch2.7.1-cpu' and plan.vars['force_cuda'] == '0'
    assert 'keep torch 2.7.1+cpu: installed (CUDA none: a CPU build)' in plan.text()
    assert 'torch is a CPU-only build' in plan.text()


def test_a_cuda_torch_with_force_cuda_and_no_gpu_builds_the_cuda_ops_for_the_default_archs(tmp_path):
    probe = _probe(torch='2.7.1+cu128', cuda='12.8')
    plan = _plan(probe, tmp_path, env={'FORCE_CUDA': '1', 'MAX_JOBS': '6'}, nvcc='/usr/local/cuda/bin/nvcc')
    assert plan.error is None
    assert plan.vars['mmcv'] == 'build' and plan.vars['force_cuda'] == '1' and plan.vars['max_jobs'] == '6'
    assert plan.vars['arch_list'] == '7.0;7.5;8.0;8.6;8.9;9.0;10.0;12.0+PTX'
    assert plan.vars['mmcv_key'] == 'torch2.7.1-cu128-sm70_75_80_86_89_90_100_120ptx'
    assert 'no GPU visible: the default list' in plan.text()
    # FORCE_CUDA=1 without a compiler: stop before the build, naming what is missing
    plan = _plan(probe, tmp_path, env={'FORCE_CUDA': '1'})
    assert 'need nvcc' in plan.error and 'CUDA_HOME' in plan.error and 'FORCE_CUDA=0' in plan.error


def test_the_cuda_target_follows_nvcc_or_a_visible_gpu_and_the_arch_list_the_gpu():
    # a login node: nvcc, no GPU; the user set-up builds the CUDA ops, the development set-up those of this machine
    assert setup_plan._cuda_target(_probe(torch='2.7.1', cuda='12.8'), {}, '/opt/cuda/bin/nvcc', user=True)[0]
    assert not setup_plan._cuda_target(_probe(torch='2.7.1', cuda='12.8'), {}, '/opt/cuda/bin/nvcc', user=False)[0]
    assert setup_plan._cuda_target(_probe(torch='2.7.1', cuda='12.8', gpus=['9.0']), {}, None)[0]
    assert not setup_plan._cuda_target(_probe(torch='2.7.1', cuda='12.8', gpus=['9.0']), {'FORCE_CUDA': '0'},
                                       '/opt/cuda/bin/nvcc')[0]
    assert not setup_plan._cuda_target(_probe(torch='2.7.1+cpu'), {'FORCE_CUDA': '1'}, '/opt/cuda/bin/nvcc')[0]
    assert setup_plan._archs(_probe(cuda='12.8', gpus=['9.0']), {}) == (['9.0'], 'the visible GPUs')
    assert setup_plan._archs(_probe(cuda='12.8'), {'TORCH_CUDA_ARCH_LIST': '8.0 9.0'})[0] == ['8.0', '9.0']
    assert setup_plan.default_archs('11.8') == ['7.0', '7.5', '8.0', '8.6', '8.9', '9.0+PTX']
    assert setup_plan.default_archs('13.0') == ['7.5', '8.0', '8.6', '8.9', '9.0', '10.0', '12.0+PTX']


def test_an_already_cached_wheel_is_installed_instead_of_built(tmp_path):
    wheel = _cache_wheel(tmp_path, 'torch2.14.1-cpu')
    plan = _plan(_probe(torch='2.14.1'), tmp_path)
    assert plan.vars['mmcv'] == 'cache' and plan.vars['mmcv_wheel'] == wheel
    assert 'max_jobs' not in plan.vars
    assert f'install mmcv 2.1.0 from the cached wheel {wheel}' in plan.text()


def test_a_cached_cpu_build_is_never_installed_for_a_cuda_target(tmp_path):
    _cache_wheel(tmp_path, 'torch2.7.1-cpu')
    plan = _plan(_probe(torch='2.7.1', cuda='12.8', gpus=['8.0']), tmp_path, nvcc='/opt/cuda/bin/nvcc')
    assert plan.vars['mmcv'] == 'build' and plan.vars['mmcv_key'] == 'torch2.7.1-cu128-sm80'
    # a login node without a GPU: --user builds for the default architectures, with nvcc
    plan = _plan(_probe(torch='2.7.1', cuda='12.8'), tmp_path, user=True, nvcc='/opt/cuda/bin/nvcc')
    assert plan.vars['force_cuda'] == '1' and plan.vars['mmcv_key'].startswith('torch2.7.1-cu128-sm70_75_80')
    # an installed mmcv with CPU-only ops is rebuilt for a CUDA target, and kept for a CPU one
    plan = _plan(_probe(torch='2.7.1', cuda='12.8', gpus=['8.0'], mmcv='2.1.0', ops='cpu'), tmp_path,
                 nvcc='/opt/cuda/bin/nvcc')
    assert plan.vars['mmcv'] == 'build' and 'has CPU-only ops and the target is CUDA' in plan.text()
    plan = _plan(_probe(torch='2.7.1+cpu', mmcv='2.1.0', ops='cpu'), tmp_path)
    assert plan.vars['mmcv'] == 'keep'


def test_an_installed_stack_is_kept_and_user_mode_installs_no_tools(tmp_path):
    probe = _probe(torch='2.7.1', cuda='12.8', gpus=['9.0'], mmcv='2.1.0', ops='cuda', mmengine='0.10.7',
                   mmdet='3.3.0', mmsegmentation='1.2.2', mmpretrain='1.2.0', timm='1.0.15',
                   **{'onnxruntime-gpu': '1.22.0'})
    plan = _plan(probe, tmp_path, user=True)
    assert plan.vars['mmcv'] == 'keep' and plan.vars['dev_tools'] == '0'
    assert 'all installed; pip keeps versions inside the ranges' in plan.text()
    assert '--user: the runtime only' in plan.text()
    # the development set-up leaves an installed onnxruntime-gpu unshadowed
    assert _plan(probe, tmp_path).vars['skip_onnxruntime'] == '1'


def test_an_mmcv_outside_the_task_libraries_range_is_replaced(tmp_path):
    plan = _plan(_probe(torch='2.14.1', mmcv='2.2.0', ops='cpu'), tmp_path)
    assert plan.vars['mmcv'] == 'build'
    assert 'mmcv 2.2.0 is outside what the task libraries accept (mmcv>=2.0.0,<2.2.0)' in plan.text()


def test_too_little_disk_for_torch_stops_the_plan(tmp_path):
    plan = _plan(dict(_probe(), free_gb=3), tmp_path)
    assert plan.error.startswith('only 3 GB free on the disk of /env')


def test_a_plan_that_stops_exits_with_1(tmp_path):
    """``setup_env.sh --plan`` whose plan ends in a stop (too little disk) prints it and exits 1, as the set-up
    itself would stop there (before, it exited 0 after the stop: line)."""
    env = dict(os.environ, MMVISATT_VENV=str(tmp_path / 'venv'), MMVISATT_CACHE=str(tmp_path / 'cache'),
               MMVISATT_NEED_GB='100000')
    run = subprocess.run(['bash', SETUP, '--plan'], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and '\nstop: only ' in run.stdout, (run.returncode, run.stdout, run.stderr)


def test_setup_plan_changes_nothing(tmp_path):
    """``setup_env.sh --plan`` for an environment still to be created (nothing is created) and for this one."""
    # the free space of the disk this runs on is not what is tested here (the low-disk refusal has its own tests)
    env = dict(os.environ, MMVISATT_VENV=str(tmp_path / 'venv'), MMVISATT_CACHE=str(tmp_path / 'cache'),
               MMVISATT_NEED_GB='0')
    run = subprocess.run(['bash', SETUP, '--plan'], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert 'create the virtual environment' in run.stdout and 'install torch 2.14.1' in run.stdout
    assert 'build mmcv 2.1.0' in run.stdout and 'torch2.14.1-cpu' in run.stdout
    assert not osp.exists(tmp_path / 'venv') and not osp.exists(tmp_path / 'cache')
    env = dict(os.environ, MMVISATT_VENV=sys.prefix)
    run = subprocess.run(['bash', SETUP, '--plan'], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    from importlib.metadata import version
    assert f"keep torch {version('torch')}" in run.stdout and f"keep mmcv {version('mmcv')}" in run.stdout
    assert 'install the test and lint tools' in run.stdout
    run = subprocess.run(['bash', SETUP, '--plan', '--user'], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and '--user: the runtime only' in run.stdout, run.stderr


def test_installing_the_package_into_the_stack_replaces_nothing():
    """``pip install -e .[mim]`` into an environment that holds torch, mmcv and the task libraries: pip's
    resolution (a dry run, offline) installs this package and nothing else."""
    run = subprocess.run([sys.executable, '-m', 'pip', 'install', '--dry-run', '--no-index', '--no-build-isolation',
                          '--disable-pip-version-check', '--quiet', '--report', '-', '-e', f'{REPO}[mim]'],
                         capture_output=True, text=True, timeout=300, cwd=REPO)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout)
    assert [item['metadata']['name'] for item in report['install']] == ['mmvisatt']
    requires = report['install'][0]['metadata']['requires_dist']
    for needed in ('torch>=2.6', 'mmengine<1.0.0,>=0.10.0', 'mmcv<2.2.0,>=2.0.0', 'timm>=1.0'):
        assert any(r.replace(' ', '').startswith(needed) for r in requires), (needed, requires)
    # no OpenMMLab distribution outside the extras: the onedl fork installs the same modules under other names
    openmmlab = [r for r in requires if r.split(';')[0].split('<')[0].split('>')[0].strip() in setup_plan.STACK_DISTS]
    assert openmmlab and all('extra ==' in r for r in openmmlab), openmmlab
    # test tools only in the tests extra
    assert all('extra ==' in r for r in requires if r.split()[0].split('[')[0] in ('pytest', 'flake8', 'onnxruntime'))


@pytest.mark.parametrize('name', ['mminstall.txt', 'runtime.txt'])
def test_requirements_are_ranges(name):
    with open(osp.join(REPO, 'requirements', name)) as f:
        lines = [line.split('#')[0].strip() for line in f]
    assert not [line for line in lines if '==' in line]


def test_a_torch_older_than_the_package_needs_stops_before_anything_is_built(tmp_path):
    """torch 2.5.1: building mmcv against it, then letting pip upgrade torch for requirements/runtime.txt, would
    leave an mmcv built for another torch."""
    plan = _plan(_probe(torch='2.5.1+cu124', cuda='12.4', gpus=['9.0']), tmp_path, nvcc='/opt/cuda/bin/nvcc')
    assert plan.error.startswith('torch 2.5.1+cu124 is installed and this package needs torch >= 2.6')
    assert 'upgrade it first' in plan.error
    assert 'mmcv' not in plan.vars and not any(what.startswith('build') for what, _ in plan.steps)


def test_a_gpu_target_without_nvcc_stops_naming_how_to_get_one(tmp_path):
    """``--user`` with a CUDA torch on a login node without nvcc or a GPU: CPU-only ops would install and the job
    would fail at its first RoIAlign on a GPU node."""
    probe = _probe(torch='2.7.1+cu128', cuda='12.8')
    plan = _plan(probe, tmp_path, user=True)
    assert plan.vars['force_cuda'] == '1'
    for needed in ('need nvcc', 'module load cuda', 'CUDA_HOME', 'FORCE_CUDA=0 for CPU-only ops on purpose'):
        assert needed in plan.error, (needed, plan.error)
    # CPU-only ops on purpose
    plan = _plan(probe, tmp_path, env={'FORCE_CUDA': '0'}, user=True)
    assert plan.error is None and plan.vars['force_cuda'] == '0'
    # a CUDA wheel built before needs no compiler
    _cache_wheel(tmp_path, plan_key := setup_plan.wheel_key('2.7.1', '12.8', setup_plan.default_archs('12.8')))
    plan = _plan(probe, tmp_path, user=True)
    assert plan.error is None and plan.vars['mmcv'] == 'cache' and plan_key in plan.vars['mmcv_wheel']


@pytest.mark.parametrize('given', ['sm_80;sm_90', '8.0,9.0', 'ampere', '80', '8.0;;sm_90', ' '])
def test_a_malformed_arch_list_is_refused_with_the_expected_form(tmp_path, given):
    probe = _probe(torch='2.7.1', cuda='12.8')
    plan = _plan(probe, tmp_path, env={'FORCE_CUDA': '1', 'TORCH_CUDA_ARCH_LIST': given}, nvcc='/opt/cuda/bin/nvcc')
    assert plan.error and "expected the form '8.0;9.0'" in plan.error and repr(given) in plan.error
    if given == 'sm_80;sm_90':
        assert '(for sm_80;sm_90: 8.0;9.0)' in plan.error


@pytest.mark.parametrize('given', ['8.0;9.0', '8.0 9.0+PTX', '9.0a', 'Ampere;Hopper', '7.5;8.6;12.0+PTX'])
def test_well_formed_arch_lists_are_built_for(tmp_path, given):
    plan = _plan(_probe(torch='2.7.1', cuda='12.8'), tmp_path,
                 env={'FORCE_CUDA': '1', 'TORCH_CUDA_ARCH_LIST': given, 'CUDA_HOME': '/opt/cuda'},
                 nvcc='/opt/cuda/bin/nvcc')
    assert plan.error is None and plan.vars['arch_list'] == ';'.join(given.split()).replace(' ', ';')


def test_a_venv_that_cannot_be_created_is_named_by_the_plan(tmp_path):
    (tmp_path / 'a_file').write_text('')
    probe = setup_plan.fresh_probe(str(tmp_path / 'a_file' / 'venv'))
    plan = _plan(probe, tmp_path, fresh=True)
    assert plan.error == (f"cannot create the virtual environment {tmp_path}/a_file/venv: {tmp_path}/a_file is a "
                          'file, not a folder. Point MMVISATT_VENV at a folder you can write, or MMVISATT_VENV=none '
                          'for the current interpreter')
    # a folder this user cannot write (root may write anywhere, so the probe's verdict is given here)
    plan = _plan(dict(_probe(), prefix='/shared/venv', blocked='/shared is not writable for this user'), tmp_path,
                 fresh=True)
    assert 'cannot create the virtual environment /shared/venv: /shared is not writable' in plan.error
    assert setup_plan.fresh_probe(str(tmp_path / 'new' / 'venv'))['blocked'] is None


def test_cuda_home_is_the_toolkit_of_nvcc_through_links_and_wrappers(tmp_path):
    """torch derives CUDA_HOME from the folder above the first nvcc on PATH; for a wrapper script (as
    ``/usr/local/bin/nvcc`` on the GPU image, which execs the cuda-13.0 toolkit's) that folder has no
    ``include/crt/host_defines.h`` and the build fails."""
    toolkit = tmp_path / 'cuda-13.0'
    (toolkit / 'bin').mkdir(parents=True)
    real = toolkit / 'bin' / 'nvcc'
    real.write_bytes(b'\x7fELF binary')
    real.chmod(0o755)
    (tmp_path / 'cuda').symlink_to(toolkit)
    wrapper = tmp_path / 'local' / 'bin' / 'nvcc'
    wrapper.parent.mkdir(parents=True)
    wrapper.write_text(f'#!/bin/sh\nexec {tmp_path}/cuda/bin/nvcc "$@"\n')
    wrapper.chmod(0o755)
    linked = tmp_path / 'linked_nvcc'
    linked.symlink_to(wrapper)
    for nvcc in (real, tmp_path / 'cuda' / 'bin' / 'nvcc', wrapper, linked):
        assert setup_plan.cuda_toolkit(str(nvcc)) == str(toolkit), nvcc
    opaque = tmp_path / 'opaque' / 'bin' / 'nvcc'
    opaque.parent.mkdir(parents=True)
    opaque.write_text('#!/bin/sh\nexec "$TOOLKIT/bin/nvcc" "$@"\n')
    assert setup_plan.cuda_toolkit(str(opaque)) is None

    probe = _probe(torch='2.7.1', cuda='12.8', gpus=['9.0'])
    plan = _plan(probe, tmp_path, nvcc=str(wrapper))
    assert plan.error is None and plan.vars['cuda_home'] == str(toolkit)
    assert f'build with CUDA_HOME={toolkit}: the toolkit of {wrapper}' in plan.text()
    # CUDA_HOME set by the user wins; a wrapper nothing can be followed through stops, asking for it
    assert _plan(probe, tmp_path, env={'CUDA_HOME': '/opt/cuda'}, nvcc=str(wrapper)).vars['cuda_home'] == '/opt/cuda'
    assert 'set CUDA_HOME to the toolkit folder' in _plan(probe, tmp_path, nvcc=str(opaque)).error


def test_a_cached_wheel_of_another_python_is_not_installed(tmp_path):
    _cache_wheel(tmp_path, 'torch2.14.1-cpu')  # cp311
    plan = _plan(dict(_probe(torch='2.14.1'), python='3.12'), tmp_path)
    assert plan.vars['mmcv'] == 'build'


def test_the_fork_is_set_up_on_request_and_kept_where_it_is(tmp_path):
    fresh = dict(_probe(), python='3.12')
    plan = _plan(fresh, tmp_path, env={'MMVISATT_STACK': 'onedl'}, fresh=True)
    assert plan.error is None
    assert plan.vars['stack'] == 'onedl' and plan.vars['stack_requirements'] == 'onedl.txt'
    assert plan.vars['mmcv_dist'] == 'onedl-mmcv' and plan.vars['mmcv_release'] == '2.3.6'
    assert plan.vars['mmengine_requirement'] == 'onedl-mmengine>=0.10.8,<1.0.0'
    assert 'build onedl-mmcv 2.3.6 from its sdist' in plan.text()
    wheels = tmp_path / 'cache' / 'wheels' / 'torch2.14.1-cpu'
    wheels.mkdir(parents=True)
    (wheels / 'onedl_mmcv-2.3.6-cp312-cp312-linux_x86_64.whl').write_bytes(b'')
    plan = _plan(fresh, tmp_path, env={'MMVISATT_STACK': 'onedl'}, fresh=True)
    assert plan.vars['mmcv'] == 'cache'
    assert plan.vars['mmcv_wheel'].endswith('onedl_mmcv-2.3.6-cp312-cp312-linux_x86_64.whl')
    # upstream's default is not installed over a fork that is there, and asking for it stops
    held = dict(_probe(torch='2.7.1', cuda='12.8', gpus=['9.0'], ops='cuda', **{
        'onedl-mmcv': '2.3.6', 'onedl-mmengine': '0.10.12', 'onedl-mmdetection': '3.5.1'}), python='3.12')
    plan = _plan(held, tmp_path)
    assert plan.error is None and plan.vars['stack'] == 'onedl' and plan.vars['mmcv'] == 'keep'
    assert 'keep onedl-mmcv 2.3.6' in plan.text() and 'the onedl fork is installed' in plan.text()
    plan = _plan(held, tmp_path, env={'MMVISATT_STACK': 'openmmlab'})
    assert 'holds the onedl fork and MMVISATT_STACK=openmmlab would install upstream OpenMMLab over it' in plan.error
    # both stacks in one environment, an unknown stack, a Python the fork does not support
    mixed = _probe(torch='2.7.1', mmcv='2.1.0', **{'onedl-mmcv': '2.3.6'})
    assert 'holds distributions of both stacks (mmcv 2.1.0, onedl-mmcv 2.3.6)' in _plan(mixed, tmp_path).error
    assert 'MMVISATT_STACK=mmlab is not a stack' in _plan(fresh, tmp_path, env={'MMVISATT_STACK': 'mmlab'}).error
    plan = _plan(dict(fresh, python='3.9'), tmp_path, env={'MMVISATT_STACK': 'onedl'})
    assert plan.error.startswith('the onedl fork needs Python >= 3.10; the environment has Python 3.9')


def test_a_cuda_request_on_a_cpu_build_is_never_up_to_date(tmp_path):
    """The up-to-date stamp is checked after the plan: FORCE_CUDA=1 in this environment (set up with CPU-only ops)
    asks for a CUDA build, so set-up does not say 'up to date' (here it stops, as no nvcc is on this PATH)."""
    env = dict(os.environ, MMVISATT_VENV=sys.prefix, MMVISATT_CACHE=str(tmp_path / 'cache'), FORCE_CUDA='1',
               PATH='/usr/bin:/bin')
    env.pop('CUDA_HOME', None)
    run = subprocess.run(['bash', SETUP], env=env, capture_output=True, text=True, timeout=300)
    assert 'up to date' not in run.stderr
    assert run.returncode == 1 and 'need nvcc' in run.stderr, run.stderr
    assert not osp.exists(tmp_path / 'cache')


def test_what_the_mmcv_build_needs_stops_the_plan_before_torch_is_downloaded(tmp_path):
    """Python's headers and a C++20 compiler: a newcomer's machine without them failed minutes into the build,
    after the torch download. The plan says so first, and only where mmcv is built."""
    plan = _plan(dict(_probe(), python_h=None), tmp_path, fresh=True)
    assert "Python 3.11's headers (Python.h) are not installed" in plan.error and 'python3.11-dev' in plan.error
    assert plan.vars['install_torch'] == '1'  # planned, not done: setup_env.sh stops on the error first
    plan = _plan(_probe(), tmp_path, fresh=True, compiler=(None, None))
    assert 'no C++ compiler' in plan.error and 'g++ 10 or newer' in plan.error
    plan = _plan(_probe(), tmp_path, fresh=True, compiler=('/usr/bin/c++', '9.4.0'))
    assert '/usr/bin/c++ is version 9.4.0' in plan.error and 'C++20' in plan.error
    plan = _plan(dict(_probe(), python_h='/usr/include/python3.11'), tmp_path, fresh=True,
                 compiler=('/usr/bin/c++', '12.2.0'))
    assert plan.error is None and plan.vars['mmcv'] == 'build'
    # a cached wheel needs neither
    _cache_wheel(tmp_path, 'torch2.14.1-cpu')
    plan = _plan(dict(_probe(torch='2.14.1'), python_h=None), tmp_path, compiler=(None, None))
    assert plan.error is None and plan.vars['mmcv'] == 'cache'


def test_a_python_without_venv_support_stops_the_plan(tmp_path):
    plan = _plan(dict(_probe(), venv=False), tmp_path, fresh=True)
    assert plan.error.startswith('Python 3.11 cannot create the virtual environment /env')
    assert 'sudo apt install python3.11-venv' in plan.error and 'MMVISATT_VENV=none' in plan.error


def test_a_gpu_the_driver_shows_makes_cuda_the_target_before_torch_is_installed(tmp_path):
    """A laptop with an NVIDIA GPU and no CUDA 13 toolkit: the plan promised CPU ops, and the set-up stopped for
    nvcc once torch was in. The GPU nvidia-smi shows is the target from the start."""
    probe = dict(_probe(), driver_gpus=['8.6'])
    plan = _plan(probe, tmp_path, fresh=True)
    assert 'need nvcc' in plan.error and 'load the CUDA toolkit 13.0' in plan.error
    assert 'CUDA_VISIBLE_DEVICES= make demo' in plan.error and 'FORCE_CUDA=0' in plan.error
    # FORCE_CUDA=0: CPU-only ops on purpose
    plan = _plan(probe, tmp_path, fresh=True, env={'FORCE_CUDA': '0'})
    assert plan.error is None and plan.vars['force_cuda'] == '0'
    # nvcc of another major CUDA than torch's: torch's extension build would refuse it
    plan = _plan(probe, tmp_path, fresh=True, nvcc='/usr/local/cuda/bin/nvcc', nvcc_version='12.4')
    assert 'is CUDA 12.4 and torch is built with CUDA 13.0' in plan.error and 'refuses' in plan.error
    plan = _plan(probe, tmp_path, fresh=True, nvcc='/usr/local/cuda/bin/nvcc', nvcc_version='13.0')
    assert plan.error is None and plan.vars['force_cuda'] == '1' and plan.vars['arch_list'] == '8.6'
    assert 'a visible GPU with a CUDA 13.0 build of torch' in plan.text()


def test_the_probe_reports_headers_venv_and_driver_gpus():
    found = setup_plan.probe()
    assert found['python_h'] and osp.isfile(osp.join(found['python_h'], 'Python.h'))
    assert isinstance(found['driver_gpus'], list)
    fresh = setup_plan.fresh_probe('/tmp/does-not-exist/venv')
    assert fresh['venv'] is True and fresh['python_h'] == found['python_h']
    path, version = setup_plan.find_compiler(os.environ)
    assert path and setup_plan.stack.parse(version) >= setup_plan.CXX_MIN
