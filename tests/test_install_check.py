"""``tools/check_install.py``: the versions of the stack, what mmcv's ops were built for, the visible GPUs, and a
forward of ReSwin-T Mask R-CNN; a non-zero exit naming the fix where something is missing or mismatched."""
import os
import subprocess
import sys

import pytest

from conftest import REPO
from mmvisatt.apis.install_check import Facts, diagnose, gather, report
from mmvisatt.stack import installed_distributions

TOOL = os.path.join(REPO, 'tools', 'check_install.py')


def _facts(**changes):
    facts = Facts(python='3.12.1', torch='2.11.0+cu130', torch_cuda='13.0', gpus=[],
                  imported=dict(mmcv='2.1.0', mmengine='0.10.7'),
                  dists=dict(dict.fromkeys(installed_distributions()), mmcv='2.1.0', mmengine='0.10.7', mmdet='3.3.0'),
                  mmcv_ops='cuda', mmcv_cuda='13.0')
    for key, value in changes.items():
        setattr(facts, key, value)
    return facts


def test_a_working_installation_has_no_problem():
    assert diagnose(_facts()) == []
    assert diagnose(_facts(mmcv_ops='cpu', mmcv_cuda=None)) == []  # CPU ops on a machine without a GPU
    assert diagnose(gather()) == []  # this environment


@pytest.mark.parametrize('changes, expected', [
    (dict(mmcv_ops='cpu', mmcv_cuda=None, gpus=['NVIDIA H200 (sm_90, 139 GiB)']),
     'mmcv 2.1.0 has CPU-only ops and 1 GPU(s) are visible: RoIAlign and NMS fail on the GPU at the first '
     'iteration; rebuild with CUDA ops: FORCE_CUDA=1 MMVISATT_VENV=none bash tools/setup_env.sh --user'),
    (dict(mmcv_ops=None, mmcv_ops_error='ImportError: /env/mmcv/_ext.so: undefined symbol: _ZN3c1017RegisterOp'),
     'mmcv 2.1.0 was built for another torch than the installed 2.11.0+cu130'),
    (dict(mmcv_ops=None, mmcv_ops_error="ModuleNotFoundError: No module named 'mmcv._ext'"),
     "mmcv 2.1.0 has no compiled ops (ModuleNotFoundError: No module named 'mmcv._ext')"),
    (dict(mmcv_cuda='11.8'), 'mmcv 2.1.0 was compiled with CUDA 11.8, torch 2.11.0+cu130 uses CUDA 13.0'),
    (dict(torch='2.5.1'), 'torch 2.5.1 is older than 2.6'),
    (dict(imported=dict(mmcv='2.2.0', mmengine='0.10.7')), 'mmcv 2.2.0 is installed; accepted:'),
])
def test_each_mismatch_is_named_with_its_fix(changes, expected):
    problems = diagnose(_facts(**changes))
    assert len(problems) == 1 and problems[0].startswith(expected), problems
    assert 'tools/setup_env.sh' in problems[0] or 'Fix' in problems[0] or 'accepted' in problems[0]


def test_the_report_names_every_library_and_the_ops():
    text = report(_facts(gpus=['NVIDIA H200 (sm_90, 139 GiB)']))
    for line in ('Python      3.12.1', 'torch       2.11.0+cu130 (CUDA 13.0)', 'mmcv        mmcv 2.1.0; ops: compiled, '
                 'CUDA 13.0, load with torch 2.11.0+cu130', 'mmengine    mmengine 0.10.7', 'mmdet       mmdet 3.3.0',
                 'GPUs        NVIDIA H200'):
        assert line in text, (line, text)


def test_the_tool_runs_the_detector_here():
    run = subprocess.run([sys.executable, TOOL, '--size', '128'], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    for name in ('Python', 'torch', 'mmcv', 'mmengine', 'mmdet', 'mmseg', 'mmpretrain', 'timm', 'mmvisatt', 'GPUs'):
        assert f'\n{name} ' in '\n' + run.stdout, name
    assert 'ops: compiled, CPU only' in run.stdout or 'ops: compiled, CUDA' in run.stdout
    assert 'Forward of mask_rcnn_reswin_t_3x.py on cpu at 128x128' in run.stdout
    assert run.stdout.rstrip().endswith('The installation works.')


def test_the_tool_stops_on_an_unsupported_stack(tmp_path):
    fake = tmp_path / 'mmcv'
    fake.mkdir()
    (fake / '__init__.py').write_text("__version__ = '2.2.0'\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), REPO]))
    run = subprocess.run([sys.executable, TOOL], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 1, run.stdout + run.stderr
    assert '- mmcv 2.2.0 is installed; accepted: mmcv>=2.0.0,<2.2.0' in run.stdout
    assert 'installed: ' in run.stdout and 'mmengine ' in run.stdout


def test_a_task_library_shadowed_on_pythonpath_is_named_with_what_python_imports(tmp_path):
    """An old mmdet checkout on PYTHONPATH comes before the installed mmdet: the report says which version Python
    imports and from where, and the check names it as a problem (before, it reported the installed 3.3.0 only)."""
    (tmp_path / 'mmdet').mkdir()
    (tmp_path / 'mmdet' / '__init__.py').write_text('from .version import __version__\n')
    (tmp_path / 'mmdet' / 'version.py').write_text("__version__ = '2.28.2'\n")
    code = ('from mmvisatt.apis.install_check import diagnose, gather, report\n'
            'facts = gather()\nprint(report(facts))\nprint(diagnose(facts))\n')
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), REPO]))
    run = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=300, env=env)
    line, = [line for line in run.stdout.splitlines() if line.startswith('mmdet ')]
    assert line.endswith(f'(imports as 2.28.2 from {tmp_path / "mmdet"})'), run.stdout
    assert 'mmdet imports as 2.28.2 (' in run.stdout
    assert 'installed): another copy comes first on sys.path' in run.stdout


def test_a_gpu_without_a_kernel_in_mmcv_is_named_with_the_arch_to_build_for():
    """The onedl fork's prebuilt CUDA wheels have no sm_80 kernels or PTX: on an A100 the first op fails with
    CUDA's "no kernel image is available"; the tool names that and the rebuild for the GPU."""
    from mmvisatt.apis.install_check import forward_failure
    facts = _facts(gpus=['NVIDIA A100-SXM4-80GB (sm_80, 79 GiB)'],
                   dists=dict(dict.fromkeys(installed_distributions()), **{'onedl-mmcv': '2.3.2'}))
    error = RuntimeError('CUDA error: no kernel image is available for execution on the device\nCUDA kernel errors '
                         'might be asynchronously reported at some other API call')
    message = forward_failure(error, 'cuda', facts)
    assert "mmcv's CUDA ops have no kernel for this GPU (NVIDIA A100-SXM4-80GB (sm_80, 79 GiB))" in message
    assert 'pip uninstall -y onedl-mmcv && TORCH_CUDA_ARCH_LIST="8.0" MMVISATT_VENV=none bash ' \
           'tools/setup_env.sh --user' in message
    assert forward_failure(ValueError('other'), 'cpu', facts) == 'The forward on cpu failed: ValueError: other'


def test_the_tool_says_how_to_check_a_gpu_node_when_it_sees_none():
    run = subprocess.run([sys.executable, TOOL, '--size', '96'], capture_output=True, text=True, timeout=600)
    import torch
    if torch.cuda.is_available() or not torch.version.cuda:
        pytest.skip('the hint is for a CUDA torch on a machine without a visible GPU')
    assert 'srun --gres=gpu:1 python tools/check_install.py' in run.stdout
