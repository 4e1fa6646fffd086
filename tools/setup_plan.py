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
is visible, or (the ``--user`` set-up, as on a cluster's login node) an ``nvcc`` is found (``$CUDA_HOME/bin``, then
``PATH``); ``FORCE_CUDA=0`` asks for CPU-only ops whatever is there. The architectures come from
``TORCH_CUDA_ARCH_LIST``, else from the visible GPUs, else from :func:`default_archs` (what a cluster of V100 to
Blackwell GPUs needs, limited to what torch's CUDA compiles for).
``MAX_JOBS`` (parallel compiler jobs) defaults to the cores. Built wheels are cached under
``$MMVISATT_CACHE/wheels/<key>``, the key naming the torch version and the target (``torch2.14.1-cpu``,
``torch2.14.1-cu128-sm80_90``), so a CPU-only build is never installed for a CUDA target.
"""
import argparse
import json
import os
import os.path as osp
import shlex
import shutil
import sys
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

#: what setup_env.sh installs where nothing is there (the versions the suite runs on)
TORCH, TORCHVISION, MMCV = '2.14.1', '0.29.1', '2.1.0'
#: the CUDA of torch 2.14.1's wheels on PyPI (a CUDA build even on a machine without a GPU)
TORCH_CUDA = '13.0'
#: the mmcv releases the task libraries accept (mmdet 3.3 and mmsegmentation 1.2: >=2.0.0rc4,<2.2.0)
MMCV_RANGE = ((2, 0, 0), (2, 2, 0))
#: free disk asked for before torch is installed (its CUDA build and the rest of the stack measured 6.7 GB)
NEED_GB = 8
PACKAGES = ('torch', 'torchvision', 'mmcv', 'mmengine', 'mmdet', 'mmsegmentation', 'mmpretrain', 'timm', 'pytest',
            'flake8', 'onnxruntime', 'onnxruntime-gpu', 'openmim', 'mmvisatt')

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
                        cuda_includes=nvidia_include_dirs())
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
            if found['packages']['mmcv']:
                try:
                    from mmcv.ops import get_compiling_cuda_version
                    cuda = get_compiling_cuda_version()
                    found['mmcv_ops'] = 'cpu' if cuda in (None, '', 'not available') else 'cuda'
                except Exception:
                    found['mmcv_ops'] = None
    return found


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
    """The probe of an environment still to be created at ``prefix`` (``--plan`` before the venv exists)."""
    existing = prefix
    while not osp.exists(existing):
        existing = osp.dirname(existing)
    return dict(python='%d.%d' % sys.version_info[:2], prefix=prefix, packages={name: None for name in PACKAGES},
                torch_cuda=None, gpus=[], mmcv_ops=None, free_gb=shutil.disk_usage(existing).free // 2**30)


def _tuple(version: str) -> Tuple[int, ...]:
    parts = []
    for part in version.split('+')[0].split('.')[:3]:
        digits = ''.join(c for c in part if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def default_archs(cuda: str) -> List[str]:
    """The GPU architectures built when none is visible and ``TORCH_CUDA_ARCH_LIST`` is unset: V100 (7.0), T4 (7.5),
    A100 (8.0), A10/RTX 30 (8.6), L40/RTX 40 (8.9), H100/H200 (9.0) and B200/RTX 50 (10.0, 12.0), each where the
    CUDA of torch compiles for it, the newest also as PTX for later GPUs."""
    version = _tuple(cuda)
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


def _in_range(version: str) -> bool:
    low, high = MMCV_RANGE
    return low <= _tuple(version) < high


def _cuda_target(found: Probe, env: Mapping[str, str], nvcc: Optional[str], user: bool = True) -> Tuple[bool, str]:
    """Whether mmcv's CUDA ops are the target, and why. An nvcc without a GPU makes CUDA the target of the user
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
    if nvcc and user:
        return True, f'nvcc ({nvcc}) beside a CUDA {cuda} build of torch (--user)'
    if nvcc:
        return False, (f'no GPU visible: the development set-up builds the ops for this machine, although nvcc '
                       f'({nvcc}) is there (FORCE_CUDA=1 builds the CUDA ops; the --user set-up does so by itself)')
    return False, (f'torch is a CUDA {cuda} build, but no GPU is visible, no nvcc was found and FORCE_CUDA is unset '
                   f'(set FORCE_CUDA=1 with CUDA_HOME to build the CUDA ops on a machine without a GPU)')


def _archs(found: Probe, env: Mapping[str, str]) -> Tuple[List[str], str]:
    if env.get('TORCH_CUDA_ARCH_LIST'):
        given = env['TORCH_CUDA_ARCH_LIST'].replace(',', ';').replace(' ', ';')
        return [a for a in given.split(';') if a], 'from TORCH_CUDA_ARCH_LIST'
    if found['gpus']:
        return list(found['gpus']), 'the visible GPUs'
    return default_archs(str(found['torch_cuda'])), 'no GPU visible: the default list (tools/setup_plan.py)'


def make_plan(found: Probe, env: Mapping[str, str], cache: str, *, user: bool = False, fresh: bool = False,
              nvcc: Optional[str] = None, jobs: Optional[int] = None) -> Plan:
    """What set-up does for the environment ``found`` (:func:`probe`): the steps with their reasons and the
    variables setup_env.sh acts on. ``fresh``: the virtual environment is created first. ``user``: the runtime
    only (no test, lint, ONNX or robustness tools)."""
    plan = Plan()
    packages = found['packages']
    if fresh:
        plan.add('create the virtual environment', 'it does not exist')

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
    else:
        if found.get('torch_error'):
            plan.error = f"torch {torch} is installed but does not import ({found['torch_error']}): repair it first"
            return plan
        plan.add(f'keep torch {torch}', f"installed (CUDA {found['torch_cuda'] or 'none: a CPU build'})")
        if packages['torchvision'] is None:
            major, minor, patch = (_tuple(torch) + (0, 0, 0))[:3]
            plan.vars['install_torchvision'] = f'0.{minor + 15}.{patch}' if major == 2 else ''
            plan.add(f"install torchvision {plan.vars['install_torchvision'] or '(matching torch)'}",
                     'torchvision is missing')

    cuda, why_target = _cuda_target(found, env, nvcc, user)
    archs, why_archs = _archs(found, env) if cuda else ([], '')
    key = wheel_key(torch, found['torch_cuda'] if cuda else None, archs)
    plan.vars['mmcv_key'] = key
    wheels = osp.join(cache, 'wheels', key)
    mmcv, ops = packages['mmcv'], found['mmcv_ops']
    target = 'CUDA' if cuda else 'CPU'
    if mmcv and _in_range(mmcv) and ops and (ops == 'cuda' or not cuda):
        plan.add(f'keep mmcv {mmcv}', f'installed, with {ops.upper()} ops; the target is {target} ({why_target})')
        plan.vars['mmcv'] = 'keep'
    else:
        if mmcv is None:
            reason = 'mmcv is not installed'
        elif not _in_range(mmcv):
            reason = f'mmcv {mmcv} is outside what mmdet 3.3 / mmsegmentation 1.2 accept (>=2.0.0,<2.2.0)'
        elif ops is None:
            reason = f'mmcv {mmcv} is installed without its compiled ops (mmcv.ops does not load)'
        else:
            reason = f'mmcv {mmcv} has CPU-only ops and the target is CUDA ({why_target})'
        cached = sorted(f for f in os.listdir(wheels) if f.startswith(f'mmcv-{MMCV}-') and f.endswith('.whl')) \
            if osp.isdir(wheels) else []
        if cached:
            plan.vars['mmcv'] = 'cache'
            plan.vars['mmcv_wheel'] = osp.join(wheels, cached[0])
            plan.add(f'install mmcv {MMCV} from the cached wheel {plan.vars["mmcv_wheel"]}',
                     f'{reason}; a wheel for {key} was built before')
        else:
            jobs = int(env.get('MAX_JOBS') or jobs or cores())
            plan.vars.update(mmcv='build', max_jobs=str(jobs), force_cuda='1' if cuda else '0',
                             arch_list=';'.join(archs), cuda_includes=':'.join(found.get('cuda_includes') or []))
            detail = (f'CUDA ops for {";".join(archs)} ({why_archs}), FORCE_CUDA=1' if cuda
                      else f'CPU-only ops ({why_target})')
            plan.add(f'build mmcv {MMCV} from its sdist with {detail}, MAX_JOBS={jobs}; cache it in {wheels}',
                     reason)
            if cuda and not nvcc:
                plan.error = (f'the CUDA ops need nvcc, and none was found in $CUDA_HOME/bin or on PATH: install the '
                              f"CUDA toolkit {found['torch_cuda']} (torch's) and set CUDA_HOME, or set FORCE_CUDA=0 "
                              'for CPU-only ops')
                return plan

    missing = [name for name in ('mmengine', 'mmdet', 'mmsegmentation', 'mmpretrain', 'timm') if not packages[name]]
    plan.add('install the runtime: requirements/runtime.txt and mminstall.txt (version ranges)',
             f"missing: {', '.join(missing)}" if missing else 'all installed; pip keeps versions inside the ranges')
    plan.vars['dev_tools'] = '0' if user else '1'
    if user:
        plan.add('skip the test, lint, ONNX and robustness tools', '--user: the runtime only')
    else:
        plan.add('install the test and lint tools, the ONNX and robustness extras, and openmim',
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
    plan = make_plan(json.loads(text), os.environ, cache, user=args.user, fresh=args.fresh,
                     nvcc=find_nvcc(os.environ))
    print(plan.shell() if args.shell else plan.text())
    return 0


if __name__ == '__main__':
    sys.exit(main())
