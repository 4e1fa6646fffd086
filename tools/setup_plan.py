"""What ``tools/setup_env.sh`` installs and builds, and why: the decisions, kept apart from the doing.

Standard library only: it runs before anything is installed, under any Python the set-up may target.

    python tools/setup_plan.py probe                 what the interpreter running it holds (JSON); setup_env.sh runs
                                                     it with the target interpreter
    python tools/setup_plan.py plan PROBE [--user] [--fresh] [--shell]
                                                     the plan for that probe (a JSON file, or - for stdin), this
                                                     machine (nvcc, cores) and the environment variables below: the
                                                     steps and their reasons, or with --shell the variables
                                                     setup_env.sh acts on

mmcv is built with its CUDA ops when CUDA is the target: torch is a CUDA build and ``FORCE_CUDA=1`` is set, or a GPU
is visible, or it is the ``--user`` set-up (as on a cluster's login node, for the GPU nodes); the build then needs an
``nvcc`` (``$CUDA_HOME/bin``, then ``PATH``), and without one the plan stops. ``FORCE_CUDA=0`` asks for CPU-only ops
whatever is there. The architectures come from
``TORCH_CUDA_ARCH_LIST``, else from the visible GPUs, else from :func:`default_archs` (what a cluster of V100 to
Blackwell GPUs needs, limited to what torch's CUDA compiles for).
``MAX_JOBS`` (parallel compiler jobs) defaults to the cores. Built wheels are cached under
``$MMVISATT_CACHE/wheels/<key>``, the key naming the torch version and the target (``torch2.14.1-cpu``,
``torch2.14.1-cu128-sm80_90``), the file name the mmcv distribution and the Python, so a CPU-only build is never
installed for a CUDA target nor one Python's wheel into another.

``MMVISATT_STACK`` picks the OpenMMLab stack of a new environment: ``openmmlab`` (upstream's last releases, mmcv
2.1.0 from its sdist; the default) or ``onedl`` (the maintained fork, onedl-mmcv 2.3.6 from its sdist; Python >=
3.10). An environment that holds one keeps it; asking for the other there stops the plan. The ranges are
``mmvisatt/stack.py``'s, read from the file (this script runs before the package can import).
"""
import argparse
import importlib.util
import json
import os
import os.path as osp
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

_spec = importlib.util.spec_from_file_location(
    'mmvisatt_stack', osp.join(osp.dirname(osp.dirname(osp.abspath(__file__))), 'mmvisatt', 'stack.py'))
stack = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(stack)

#: what setup_env.sh installs where nothing is there (the versions the suite runs on)
TORCH, TORCHVISION = '2.14.1', '0.29.1'
#: the oldest torch the package runs on (requirements/runtime.txt)
TORCH_MIN = (2, 6)
#: the CUDA of torch 2.14.1's wheels on PyPI (a CUDA build even on a machine without a GPU)
TORCH_CUDA = '13.0'
#: per stack: the mmcv release built from its sdist, the requirements file of the rest, the oldest Python
BUILDS = {
    'openmmlab': dict(mmcv='2.1.0', requirements='mminstall.txt', python=(3, 9)),
    'onedl': dict(mmcv='2.3.6', requirements='onedl.txt', python=(3, 10)),
}
DEFAULT_STACK = 'openmmlab'
#: free disk asked for before torch is installed (its CUDA build and the rest of the stack measured 6.7 GB)
NEED_GB = 8
#: the oldest g++ / clang++ that compiles C++20, which torch >= 2.14's headers and so mmcv's ops need
CXX_MIN = (10, )
#: torch's names for GPU generations, accepted in TORCH_CUDA_ARCH_LIST beside compute capabilities
NAMED_ARCHS = ('Kepler+Tesla', 'Kepler', 'Maxwell+Tegra', 'Maxwell', 'Pascal', 'Volta', 'Turing', 'Ampere', 'Ada',
               'Hopper', 'Blackwell')
STACK_DISTS = tuple(lib.dist for libs in stack.STACKS.values() for lib in libs.values())
PACKAGES = ('torch', 'torchvision') + STACK_DISTS + ('timm', 'pytest', 'flake8', 'onnxruntime', 'onnxruntime-gpu',
                                                     'openmim', 'mmvisatt')

Probe = Dict[str, object]


def _version(name: str) -> Optional[str]:
    try:
        from importlib import metadata
    except ImportError:  # Python < 3.8 has no importlib.metadata: nothing of the stack runs there anyway
        return None
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def probe() -> Probe:
    """What this interpreter holds: package versions, torch's CUDA and visible GPUs, whether mmcv's compiled ops
    load and for which device, and the free disk under its prefix."""
    found: Probe = dict(python='%d.%d' % sys.version_info[:2], prefix=sys.prefix,
                        packages={name: _version(name) for name in PACKAGES}, torch_cuda=None, gpus=[],
                        mmcv_ops=None, free_gb=shutil.disk_usage(sys.prefix).free // 2**30,
                        cuda_includes=nvidia_include_dirs(), python_h=python_headers(), driver_gpus=driver_gpus())
    if found['packages']['torch']:
        try:
            import torch
        except Exception as error:  # a broken torch is reported as such, and set-up leaves it to the user
            found['torch_error'] = f'{type(error).__name__}: {error}'
        else:
            found['torch_cuda'] = torch.version.cuda
            if torch.cuda.is_available():
                found['gpus'] = sorted({'%d.%d' % torch.cuda.get_device_capability(i)
                                        for i in range(torch.cuda.device_count())})
            if found['packages']['mmcv'] or found['packages']['onedl-mmcv']:
                try:
                    from mmcv.ops import get_compiling_cuda_version
                    cuda = get_compiling_cuda_version()
                    found['mmcv_ops'] = 'cpu' if cuda in (None, '', 'not available') else 'cuda'
                except Exception:
                    found['mmcv_ops'] = None
    return found


def python_headers() -> Optional[str]:
    """The folder of this interpreter's ``Python.h``, or None where the headers are not installed (a C extension
    such as mmcv's ops cannot be built then)."""
    include = sysconfig.get_paths().get('include') or ''
    return include if osp.isfile(osp.join(include, 'Python.h')) else None


def driver_gpus() -> List[str]:
    """The compute capabilities of the GPUs the NVIDIA driver shows (``nvidia-smi``), without torch: what a
    visible GPU will make the target before torch is installed. Empty without a driver or GPU."""
    smi = shutil.which('nvidia-smi')
    if not smi:
        return []
    try:
        out = subprocess.run([smi, '--query-gpu=compute_cap', '--format=csv,noheader'], capture_output=True,
                             text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return sorted({line.strip() for line in out.splitlines() if re.fullmatch(r'\d+\.\d+', line.strip())})


def find_compiler(env: Mapping[str, str]) -> Tuple[Optional[str], Optional[str]]:
    """The C++ compiler torch's extension build will use (``CXX``, else ``c++``, else ``g++``) and its version, or
    (None, None)."""
    path = shutil.which(env.get('CXX') or 'c++', path=env.get('PATH')) or shutil.which('g++', path=env.get('PATH'))
    if not path:
        return None, None
    try:
        out = subprocess.run([path, '--version'], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return path, None
    m = re.search(r'(\d+\.\d+(?:\.\d+)?)', out.splitlines()[0] if out else '')
    return path, m.group(1) if m else None


def nvcc_cuda(nvcc: Optional[str]) -> Optional[str]:
    """The CUDA release of ``nvcc`` (``12.8``), or None."""
    if not nvcc:
        return None
    try:
        out = subprocess.run([nvcc, '--version'], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r'release (\d+\.\d+)', out)
    return m.group(1) if m else None


def nvidia_include_dirs() -> List[str]:
    """The header folders of the CUDA libraries that torch's pip wheels install (``nvidia/<lib>/include``,
    ``nvidia/cu13/include``): torch's headers include cusparse.h and cublas.h, which a CUDA toolkit without those
    libraries lacks."""
    import glob
    try:
        import nvidia
    except ImportError:
        return []
    found = set()
    for root in getattr(nvidia, '__path__', []):
        found.update(glob.glob(osp.join(root, '*', 'include')) + glob.glob(osp.join(root, '*', '*', 'include')))
    return sorted(found)


def fresh_probe(prefix: str) -> Probe:
    """The probe of an environment still to be created at ``prefix`` (``--plan`` before the venv exists), with
    ``blocked``: why it cannot be created there, if it cannot (a file on the path, a folder this user or a read-only
    file system does not let us write)."""
    existing = prefix
    while not osp.exists(existing):
        existing = osp.dirname(existing)
    blocked = None
    if not osp.isdir(existing):
        blocked = f'{existing} is a file, not a folder'
    elif not os.access(existing, os.W_OK | os.X_OK):
        blocked = f'{existing} is not writable for this user'
    # ``python -m venv`` needs ensurepip, which Debian and Ubuntu ship apart (python3.X-venv)
    venv = importlib.util.find_spec('venv') is not None and importlib.util.find_spec('ensurepip') is not None
    return dict(python='%d.%d' % sys.version_info[:2], prefix=prefix, packages={name: None for name in PACKAGES},
                torch_cuda=None, gpus=[], mmcv_ops=None, free_gb=shutil.disk_usage(existing).free // 2**30,
                blocked=blocked, venv=venv, python_h=python_headers(), driver_gpus=driver_gpus())


def default_archs(cuda: str) -> List[str]:
    """The GPU architectures built when none is visible and ``TORCH_CUDA_ARCH_LIST`` is unset: V100 (7.0), T4 (7.5),
    A100 (8.0), A10/RTX 30 (8.6), L40/RTX 40 (8.9), H100/H200 (9.0) and B200/RTX 50 (10.0, 12.0), each where the
    CUDA of torch compiles for it, the newest also as PTX for later GPUs."""
    version = stack.parse(cuda)
    archs = ['7.0', '7.5', '8.0', '8.6']
    if version >= (11, 8):
        archs += ['8.9', '9.0']
    if version >= (12, 8):
        archs += ['10.0', '12.0']
    if version >= (13, ):
        archs.remove('7.0')
    archs[-1] += '+PTX'
    return archs


def wheel_key(torch_version: str, cuda: Optional[str], archs: Sequence[str]) -> str:
    """The cache folder of mmcv wheels built for this torch and target."""
    base = 'torch%s' % torch_version.split('+')[0]
    if cuda is None:
        return base + '-cpu'
    sm = '_'.join(a.replace('.', '').replace('+PTX', 'ptx') for a in archs)
    return '%s-cu%s-sm%s' % (base, cuda.replace('.', ''), sm)


def find_nvcc(env: Mapping[str, str]) -> Optional[str]:
    home = env.get('CUDA_HOME') or env.get('CUDA_PATH')
    if home and os.access(osp.join(home, 'bin', 'nvcc'), os.X_OK):
        return osp.join(home, 'bin', 'nvcc')
    return shutil.which('nvcc', path=env.get('PATH'))


def cuda_toolkit(nvcc: str, depth: int = 4) -> Optional[str]:
    """The CUDA toolkit folder that ``nvcc`` belongs to (the one holding ``bin/nvcc`` and ``include/crt``), through
    symbolic links and through wrapper scripts that exec another nvcc by its absolute path (as ``module load`` set-ups
    and some images install). torch takes ``CUDA_HOME`` from the folder above the first nvcc on PATH, and a
    wrapper's folder has no ``include/crt/host_defines.h``. None where a wrapper names no nvcc we can follow."""
    real = osp.realpath(nvcc)
    try:
        with open(real, 'rb') as f:
            head = f.read(8192)
    except OSError:  # unreadable: the usual layout, <toolkit>/bin/nvcc
        head = b''
    if not head.startswith(b'#!'):
        return osp.dirname(osp.dirname(real))
    if depth:
        for target in re.findall(rb'(/[^\s\'";|&<>()]*/bin/nvcc)\b', head):
            target = target.decode(errors='replace')
            if osp.realpath(target) != real and os.access(target, os.X_OK):
                return cuda_toolkit(target, depth - 1)
    return None


def arch_list_problem(given: str) -> Optional[str]:
    """Why ``TORCH_CUDA_ARCH_LIST`` is not a list torch's build accepts, or None: compute capabilities such as
    ``8.0;9.0`` (``+PTX`` allowed, separated by ``;`` or spaces) or torch's generation names (``Ampere``)."""
    entries = [a for a in re.split(r'[;\s]+', given.strip()) if a]
    bad = [a for a in entries if not re.fullmatch(r'\d+\.\d+[af]?(\+PTX)?', a) and a not in NAMED_ARCHS]
    if not entries or bad:
        capabilities = [f'{m.group(1)[:-1]}.{m.group(1)[-1]}' for a in bad
                        for m in [re.fullmatch(r'(?:sm_|compute_)(\d{2,3})', a)] if m]
        hint = f" (for {';'.join(bad)}: {';'.join(capabilities)})" if len(capabilities) == len(bad) and bad else ''
        return (f"TORCH_CUDA_ARCH_LIST={given!r} is not a list of compute capabilities{hint}: expected the form "
                "'8.0;9.0' (separated by ';' or spaces, '+PTX' allowed on an entry), as torch's build reads it")
    return None


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else (os.cpu_count() or 1)


class Plan:
    """Steps (what, why) in order, the variables setup_env.sh acts on, or the error that stops it."""

    def __init__(self) -> None:
        self.steps: List[Tuple[str, str]] = []
        self.vars: Dict[str, str] = {}
        self.error: Optional[str] = None

    def add(self, what: str, why: str) -> None:
        self.steps.append((what, why))

    def text(self) -> str:
        lines = [f'- {what}: {why}' for what, why in self.steps]
        if self.error:
            lines.append(f'stop: {self.error}')
        return '\n'.join(lines)

    def shell(self) -> str:
        values = dict(self.vars, plan_error=self.error or '')
        return '\n'.join(f'{k}={shlex.quote(v)}' for k, v in sorted(values.items()))


def _cuda_target(found: Probe, env: Mapping[str, str], nvcc: Optional[str], user: bool = True) -> Tuple[bool, str]:
    """Whether mmcv's CUDA ops are the target, and why. A CUDA torch without a GPU makes CUDA the target of the user
    set-up (a login node installs for the GPUs of its compute nodes), not of the development set-up, whose tests
    run on this machine: a CPU machine whose image carries a CUDA toolkit would otherwise compile the CUDA
    kernels for every architecture on its few cores."""
    cuda, force = found['torch_cuda'], env.get('FORCE_CUDA')
    if not cuda:
        return False, 'torch is a CPU-only build'
    if force == '0':
        return False, 'FORCE_CUDA=0 asks for CPU-only ops'
    if force == '1':
        return True, f'FORCE_CUDA=1 with a CUDA {cuda} build of torch'
    if found['gpus']:
        return True, f'a visible GPU with a CUDA {cuda} build of torch'
    if user:
        # a login node installs for the GPUs of its compute nodes: CPU-only ops would fail at their first RoIAlign
        return True, (f'a CUDA {cuda} build of torch (--user installs for the GPU nodes)' if not nvcc else
                      f'nvcc ({nvcc}) beside a CUDA {cuda} build of torch (--user)')
    if nvcc:
        return False, (f'no GPU visible: the development set-up builds the ops for this machine, although nvcc '
                       f'({nvcc}) is there (FORCE_CUDA=1 builds the CUDA ops; the --user set-up does so by itself)')
    return False, (f'torch is a CUDA {cuda} build, but no GPU is visible, no nvcc was found and FORCE_CUDA is unset '
                   f'(set FORCE_CUDA=1 with CUDA_HOME to build the CUDA ops on a machine without a GPU)')


def _archs(found: Probe, env: Mapping[str, str]) -> Tuple[List[str], str]:
    if env.get('TORCH_CUDA_ARCH_LIST'):
        return [a for a in re.split(r'[;\s]+', env['TORCH_CUDA_ARCH_LIST']) if a], 'from TORCH_CUDA_ARCH_LIST'
    if found['gpus']:
        return list(found['gpus']), 'the visible GPUs'
    return default_archs(str(found['torch_cuda'])), 'no GPU visible: the default list (tools/setup_plan.py)'


def _stack(found: Probe, env: Mapping[str, str]) -> Tuple[Optional[str], str]:
    """The stack to set up and why, or (None, the reason it cannot be chosen)."""
    asked = env.get('MMVISATT_STACK') or ''
    held = stack.stack_of(found['packages'])
    if asked and asked not in stack.STACKS:
        return None, f"MMVISATT_STACK={asked} is not a stack: use {' or '.join(stack.STACKS)}"
    if held == 'mixed':
        names = ', '.join(f'{d} {v}' for d, v in found['packages'].items() if d in STACK_DISTS and v)
        return None, (f'the environment holds distributions of both stacks ({names}): they install the same modules '
                      'over each other; uninstall one stack, or set up a new environment (MMVISATT_VENV)')
    if held and asked and asked != held:
        return None, (f'the environment holds {stack.STACK_NAMES[held]} and MMVISATT_STACK={asked} would install '
                      f'{stack.STACK_NAMES[asked]} over it: unset MMVISATT_STACK to keep it, or set up a new '
                      'environment (MMVISATT_VENV)')
    if held:
        return held, f'{stack.STACK_NAMES[held]} is installed'
    if asked:
        return asked, f'MMVISATT_STACK={asked}'
    return DEFAULT_STACK, f'the default (MMVISATT_STACK={"|".join(stack.STACKS)} chooses)'


def _build_tools_problem(found: Probe, compiler: Optional[Tuple[Optional[str], Optional[str]]]) -> Optional[str]:
    """Why mmcv's ops cannot be compiled here (no Python headers, no C++20 compiler), or None. Said before the
    torch download, not minutes into the build."""
    if 'python_h' in found and not found['python_h']:
        version = found['python']
        return (f"Python {version}'s headers (Python.h) are not installed, and building mmcv's ops needs them: "
                f'install them (Debian / Ubuntu: sudo apt install python{version}-dev; Fedora / RHEL: sudo dnf '
                f'install python{version}-devel; conda: they come with its python), then run the set-up again')
    if compiler is None:
        return None
    path, version = compiler
    if not path:
        return ('no C++ compiler (c++ / g++) was found, and building mmcv\'s ops needs one that compiles C++20: '
                'install g++ 10 or newer (Debian / Ubuntu: sudo apt install g++; on a cluster: module load gcc), or '
                'set CXX to one')
    if version and stack.parse(version)[:len(CXX_MIN)] < CXX_MIN:
        return (f"{path} is version {version}, and mmcv's ops are compiled as C++20 (torch's headers need it), "
                f"which needs g++ or clang++ {'.'.join(map(str, CXX_MIN))} or newer: load a newer compiler (e.g. "
                '`module load gcc/12`) or set CXX to one')
    return None


def make_plan(found: Probe, env: Mapping[str, str], cache: str, *, user: bool = False, fresh: bool = False,
              nvcc: Optional[str] = None, jobs: Optional[int] = None, nvcc_version: Optional[str] = None,
              compiler: Optional[Tuple[Optional[str], Optional[str]]] = None) -> Plan:
    """What set-up does for the environment ``found`` (:func:`probe`): the steps with their reasons and the
    variables setup_env.sh acts on. ``fresh``: the virtual environment is created first. ``user``: the runtime
    only (no test, lint, ONNX or robustness tools). ``nvcc_version``: the CUDA release of ``nvcc``;
    ``compiler``: (path, version) of the C++ compiler (:func:`find_compiler`), None where not looked for.
    Everything that would stop the set-up stops the plan, before anything is installed or built."""
    plan = Plan()
    packages = found['packages']
    if fresh:
        if found.get('blocked'):
            plan.error = (f"cannot create the virtual environment {found['prefix']}: {found['blocked']}. Point "
                          'MMVISATT_VENV at a folder you can write, or MMVISATT_VENV=none for the current interpreter')
            return plan
        if found.get('venv') is False:
            version = found['python']
            plan.error = (f'Python {version} cannot create the virtual environment {found["prefix"]}: its venv module '
                          f'has no ensurepip. Install it (Debian / Ubuntu: sudo apt install python{version}-venv), '
                          'or set PYTHON to an interpreter that has it, or MMVISATT_VENV=none to install into the '
                          'current interpreter')
            return plan
        plan.add('create the virtual environment', 'it does not exist')

    chosen, why_stack = _stack(found, env)
    if chosen is None:
        plan.error = why_stack
        return plan
    build = BUILDS[chosen]
    python = tuple(int(p) for p in str(found['python']).split('.')[:2])
    if python < build['python']:
        plan.error = (f"{stack.STACK_NAMES[chosen]} needs Python >= {'.'.join(map(str, build['python']))}; the "
                      f"environment has Python {found['python']}: set PYTHON (a new venv) or use another interpreter")
        return plan
    libs = stack.STACKS[chosen]
    mmcv_dist, mmcv_release = libs['mmcv'].dist, build['mmcv']
    plan.vars.update(stack=chosen, stack_requirements=build['requirements'], mmcv_dist=mmcv_dist,
                     mmcv_release=mmcv_release, mmengine_requirement=libs['mmengine'].requirement())
    plan.add(f'use {stack.STACK_NAMES[chosen]} ({mmcv_dist}, requirements/{build["requirements"]})', why_stack)

    torch = packages['torch']
    if torch is None:
        need = int(env.get('MMVISATT_NEED_GB') or NEED_GB)
        if int(found['free_gb']) < need:
            plan.error = (f"only {found['free_gb']} GB free on the disk of {found['prefix']}: torch {TORCH} (a CUDA "
                          'build with its libraries) and the rest of the stack take about 7 GB. Free some space, or '
                          'point MMVISATT_VENV at a larger disk.')
            return plan
        plan.add(f'install torch {TORCH} + torchvision {TORCHVISION}',
                 'no torch is installed (for a CUDA build of your choice, install it first)')
        plan.vars['install_torch'] = '1'
        torch, found = TORCH, dict(found, torch_cuda=TORCH_CUDA)
        if not found['gpus'] and found.get('driver_gpus'):
            # the GPUs torch will see once installed (nvidia-smi's): they make CUDA the target now, not after the
            # torch download
            found['gpus'] = list(found['driver_gpus'])
    else:
        if found.get('torch_error'):
            plan.error = f"torch {torch} is installed but does not import ({found['torch_error']}): repair it first"
            return plan
        if stack.parse(torch)[:2] < TORCH_MIN:
            plan.error = (f"torch {torch} is installed and this package needs torch >= {'.'.join(map(str, TORCH_MIN))}"
                          ' (requirements/runtime.txt): upgrade it first with the build for your CUDA (the install '
                          'command for your CUDA version on pytorch.org), then run the set-up again; an mmcv built '
                          'now would not load after the upgrade')
            return plan
        plan.add(f'keep torch {torch}', f"installed (CUDA {found['torch_cuda'] or 'none: a CPU build'})")
        if packages['torchvision'] is None:
            major, minor, patch = stack.parse(torch)
            plan.vars['install_torchvision'] = f'0.{minor + 15}.{patch}' if major == 2 else ''
            plan.add(f"install torchvision {plan.vars['install_torchvision'] or '(matching torch)'}",
                     'torchvision is missing')

    cuda, why_target = _cuda_target(found, env, nvcc, user)
    if cuda and env.get('TORCH_CUDA_ARCH_LIST'):
        problem = arch_list_problem(env['TORCH_CUDA_ARCH_LIST'])
        if problem:
            plan.error = problem
            return plan
    archs, why_archs = _archs(found, env) if cuda else ([], '')
    key = wheel_key(torch, found['torch_cuda'] if cuda else None, archs)
    plan.vars['mmcv_key'] = key
    wheels = osp.join(cache, 'wheels', key)
    mmcv, ops = packages[mmcv_dist], found['mmcv_ops']
    target = 'CUDA' if cuda else 'CPU'
    if mmcv and libs['mmcv'].accepts(mmcv) and ops and (ops == 'cuda' or not cuda):
        plan.add(f'keep {mmcv_dist} {mmcv}', f'installed, with {ops.upper()} ops; the target is {target} '
                 f'({why_target})')
        plan.vars['mmcv'] = 'keep'
    else:
        if mmcv is None:
            reason = f'{mmcv_dist} is not installed'
        elif not libs['mmcv'].accepts(mmcv):
            reason = f"{mmcv_dist} {mmcv} is outside what the task libraries accept ({libs['mmcv'].requirement()})"
        elif ops is None:
            reason = f'{mmcv_dist} {mmcv} is installed without its compiled ops (mmcv.ops does not load)'
        else:
            reason = f'{mmcv_dist} {mmcv} has CPU-only ops and the target is CUDA ({why_target})'
        # a wheel's file name: the distribution with '-' as '_', the release, the Python tag
        prefix = '%s-%s-cp%s-' % (mmcv_dist.replace('-', '_'), mmcv_release, ''.join(str(p) for p in python))
        plan.vars['wheel_prefix'] = prefix
        cached = sorted(f for f in os.listdir(wheels) if f.startswith(prefix) and f.endswith('.whl')) \
            if osp.isdir(wheels) else []
        if cached:
            plan.vars['mmcv'] = 'cache'
            plan.vars['mmcv_wheel'] = osp.join(wheels, cached[0])
            plan.add(f'install {mmcv_dist} {mmcv_release} from the cached wheel {plan.vars["mmcv_wheel"]}',
                     f'{reason}; a wheel for {key} was built before')
        else:
            jobs = int(env.get('MAX_JOBS') or jobs or cores())
            plan.vars.update(mmcv='build', max_jobs=str(jobs), force_cuda='1' if cuda else '0',
                             arch_list=';'.join(archs), cuda_includes=':'.join(found.get('cuda_includes') or []))
            detail = (f'CUDA ops for {";".join(archs)} ({why_archs}; {why_target}), FORCE_CUDA=1' if cuda
                      else f'CPU-only ops ({why_target})')
            plan.add(f'build {mmcv_dist} {mmcv_release} from its sdist with {detail}, MAX_JOBS={jobs}; cache it in '
                     f'{wheels}', reason)
            problem = _build_tools_problem(found, compiler)
            if problem:
                plan.error = problem
                return plan
            if cuda:
                if not nvcc:
                    plan.error = (f"the CUDA ops ({why_target}) need nvcc, and none was found in $CUDA_HOME/bin or "
                                  f"on PATH: load the CUDA toolkit {found['torch_cuda']} (torch's), e.g. `module "
                                  "load cuda`, or install it and set CUDA_HOME to its folder; or set FORCE_CUDA=0 "
                                  'for CPU-only ops on purpose (they cannot run RoIAlign or NMS on a GPU'
                                  + (': run on the CPU then, e.g. CUDA_VISIBLE_DEVICES= make demo)'
                                     if packages['torch'] is None else ')'))
                    return plan
                torch_major = str(found['torch_cuda']).split('.')[0]
                if nvcc_version and nvcc_version.split('.')[0] != torch_major:
                    plan.error = (f"{nvcc} is CUDA {nvcc_version} and torch is built with CUDA {found['torch_cuda']}: "
                                  "torch's extension build refuses another major CUDA version. Load the CUDA "
                                  f"{found['torch_cuda']} toolkit (e.g. `module load cuda/{found['torch_cuda']}`) "
                                  f'and set CUDA_HOME to it, or install the torch build for CUDA {nvcc_version} '
                                  'first (pytorch.org), or set FORCE_CUDA=0 for CPU-only ops on purpose')
                    return plan
                home = env.get('CUDA_HOME') or cuda_toolkit(nvcc)
                if not home:
                    plan.error = (f'{nvcc} is a wrapper script whose CUDA toolkit could not be found: set CUDA_HOME to '
                                  'the toolkit folder (the one holding bin/nvcc and include/crt)')
                    return plan
                plan.vars['cuda_home'] = home
                plan.add(f'build with CUDA_HOME={home}', f'the toolkit of {nvcc}' if not env.get('CUDA_HOME')
                         else 'set in the environment')

    missing = [lib.dist for name, lib in libs.items() if name != 'mmcv' and not packages[lib.dist]]
    missing += [] if packages['timm'] else ['timm']
    plan.add(f'install the runtime: requirements/runtime.txt and {build["requirements"]} (version ranges)',
             f"missing: {', '.join(missing)}" if missing else 'all installed; pip keeps versions inside the ranges')
    plan.vars['dev_tools'] = '0' if user else '1'
    if user:
        plan.add('skip the test, lint, ONNX and robustness tools', '--user: the runtime only')
    else:
        plan.add('install the test and lint tools, the ONNX and robustness extras'
                 + (', and openmim' if chosen == 'openmmlab' else ''),
                 'the development set-up (make test runs the whole suite)')
        if packages['onnxruntime-gpu']:
            plan.vars['skip_onnxruntime'] = '1'
            plan.add('leave out onnxruntime', f"onnxruntime-gpu {packages['onnxruntime-gpu']} is installed, and "
                     'onnxruntime beside it would shadow it')
    plan.add('install this package (editable, without dependencies)',
             f"installed: {packages['mmvisatt']}" if packages['mmvisatt'] else 'not installed yet')
    return plan


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    sub = parser.add_subparsers(dest='command', required=True)
    probe_args = sub.add_parser('probe')
    probe_args.add_argument('--fresh', metavar='PREFIX', help='for an environment still to be created there')
    plan_args = sub.add_parser('plan')
    plan_args.add_argument('probe', help='the JSON of `probe` (a file, or - for stdin)')
    plan_args.add_argument('--user', action='store_true')
    plan_args.add_argument('--fresh', action='store_true', help='the environment is created first')
    plan_args.add_argument('--shell', action='store_true', help='print the variables setup_env.sh acts on')
    args = parser.parse_args(argv)
    if args.command == 'probe':
        print(json.dumps(fresh_probe(osp.abspath(args.fresh)) if args.fresh else probe()))
        return 0
    text = sys.stdin.read() if args.probe == '-' else open(args.probe).read()
    cache = os.environ.get('MMVISATT_CACHE') or osp.join(osp.expanduser('~'), '.cache', 'mmvisatt')
    nvcc = find_nvcc(os.environ)
    plan = make_plan(json.loads(text), os.environ, cache, user=args.user, fresh=args.fresh, nvcc=nvcc,
                     nvcc_version=nvcc_cuda(nvcc), compiler=find_compiler(os.environ))
    print(plan.shell() if args.shell else plan.text())
    # the readable plan ends with its stop: the status says so to a script; setup_env.sh reads plan_error itself
    return 1 if plan.error and not args.shell else 0


if __name__ == '__main__':
    sys.exit(main())
