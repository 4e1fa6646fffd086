"""Is this installation able to train? What ``tools/check_install.py`` reports.

:func:`gather` reads the versions of the stack and what mmcv's compiled ops were built for, :func:`diagnose` turns
those facts into problems with their fix (a pure function: the tests give it the facts of machines they are not
on), and :func:`smoke_forward` runs ReSwin-T Mask R-CNN once on a small image, on the GPU where one is visible, so
that RoIAlign and NMS run where training will run them.
"""
import importlib
import importlib.util
import os.path as osp
import platform
import re
import time
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Dict, List, Optional, Tuple

import torch

from mmvisatt.stack import STACKS, installed_distributions, parse, stack_problems

#: what a training run needs besides the stack
TORCH_MIN = (2, 6)
REBUILD = 'tools/setup_env.sh (MMVISATT_VENV=none ... --user in your environment) builds it for the torch there'


@dataclass
class Facts:
    """What :func:`gather` found. ``mmcv_ops``: 'cuda', 'cpu' or None (no compiled ops load), with
    ``mmcv_ops_error`` why not; ``mmcv_cuda``: the CUDA its ops were compiled with."""
    python: str
    torch: str
    torch_cuda: Optional[str]
    gpus: List[str]
    imported: Dict[str, Optional[str]]
    dists: Dict[str, Optional[str]]
    mmcv_ops: Optional[str] = None
    mmcv_ops_error: Optional[str] = None
    mmcv_cuda: Optional[str] = None
    others: Dict[str, Optional[str]] = field(default_factory=dict)
    origins: Dict[str, Optional[str]] = field(default_factory=dict)


def _version(dist: str) -> Optional[str]:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _importable(name: str) -> Tuple[Optional[str], Optional[str]]:
    """The ``__version__`` of the package ``name`` that ``import name`` would load (the first on ``sys.path``: an old
    checkout on ``PYTHONPATH`` before the installed one), read from its ``version.py`` without importing it, and
    its folder; (None, None) where there is none."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.origin:
        return None, None
    folder = osp.dirname(spec.origin)
    try:
        with open(osp.join(folder, 'version.py')) as f:
            found = re.search(r"""__version__\s*=\s*['"]([^'"]+)['"]""", f.read())
    except OSError:
        found = None
    return (found.group(1) if found else None), folder


def _same_folder(folder: str, dist: str, name: str) -> bool:
    try:
        installed = metadata.distribution(dist).locate_file(name)
    except metadata.PackageNotFoundError:
        return False
    return osp.realpath(folder) == osp.realpath(str(installed))


def gather() -> Facts:
    """The facts of this interpreter. Imports mmcv and mmengine; the task libraries' versions are read from the
    packages Python would import (:func:`_importable`), which an old checkout on ``PYTHONPATH`` can shadow."""
    imported: Dict[str, Optional[str]] = {}
    origins: Dict[str, Optional[str]] = {}
    for name in ('mmcv', 'mmengine'):
        try:
            module = importlib.import_module(name)
            imported[name], origins[name] = module.__version__, osp.dirname(module.__file__)
        except ImportError:
            imported[name] = None
    dists = installed_distributions()
    for name in ('mmdet', 'mmseg', 'mmpretrain'):
        imported[name], origins[name] = _importable(name)
        for libraries in STACKS.values():
            # the installed distribution's own folder: its metadata's version is the one that imports
            dist = libraries[name].dist
            if dists.get(dist) and origins[name] and _same_folder(origins[name], dist, name):
                imported[name] = dists[dist]
    gpus = [f'{torch.cuda.get_device_name(i)} (sm_{"".join(map(str, torch.cuda.get_device_capability(i)))}, '
            f'{torch.cuda.get_device_properties(i).total_memory / 2**30:.0f} GiB)'
            for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    facts = Facts(python=platform.python_version(), torch=torch.__version__, torch_cuda=torch.version.cuda,
                  gpus=gpus, imported=imported, dists=dists,
                  others={name: _version(name) for name in ('torchvision', 'timm', 'mmvisatt')}, origins=origins)
    if imported['mmcv']:
        try:
            from mmcv.ops import get_compiling_cuda_version
            cuda = get_compiling_cuda_version()
        except Exception as error:  # no _ext, or one built for another torch (undefined symbols)
            facts.mmcv_ops_error = f'{type(error).__name__}: {error}'
        else:
            facts.mmcv_ops = 'cpu' if cuda in (None, '', 'not available') else 'cuda'
            facts.mmcv_cuda = None if facts.mmcv_ops == 'cpu' else cuda
    return facts


def diagnose(facts: Facts) -> List[str]:
    """Each problem that stops training, with its fix; empty when the installation can train."""
    problems = []
    if parse(facts.torch)[:2] < TORCH_MIN:
        problems.append(f'torch {facts.torch} is older than {".".join(map(str, TORCH_MIN))}, the oldest this package '
                        'runs on: install a newer build for your CUDA, then rebuild mmcv for it (' + REBUILD + ')')
    problems += stack_problems(facts.imported, facts.dists)
    mmcv = facts.imported.get('mmcv')
    if mmcv:
        if facts.mmcv_ops is None:
            error = facts.mmcv_ops_error or ''
            if 'undefined symbol' in error:
                problems.append(f'mmcv {mmcv} was built for another torch than the installed {facts.torch} (its '
                                f'compiled ops do not load: {_short(error)}): rebuild it; ' + REBUILD)
            else:
                problems.append(f'mmcv {mmcv} has no compiled ops ({_short(error)}): RoIAlign, NMS and the other '
                                'ops the detectors use are missing; ' + REBUILD)
        elif facts.mmcv_ops == 'cpu' and facts.gpus:
            problems.append(f'mmcv {mmcv} has CPU-only ops and {len(facts.gpus)} GPU(s) are visible: RoIAlign and NMS '
                            'fail on the GPU at the first iteration; rebuild with CUDA ops: FORCE_CUDA=1 '
                            'MMVISATT_VENV=none bash tools/setup_env.sh --user')
        elif facts.mmcv_ops == 'cuda' and facts.torch_cuda and facts.mmcv_cuda and \
                parse(facts.mmcv_cuda)[0] != parse(facts.torch_cuda)[0]:
            problems.append(f'mmcv {mmcv} was compiled with CUDA {facts.mmcv_cuda}, torch {facts.torch} uses CUDA '
                            f'{facts.torch_cuda}: rebuild mmcv with the toolkit of torch\'s CUDA; ' + REBUILD)
    return problems


def _short(error: str, limit: int = 160) -> str:
    error = re.sub(r'\s+', ' ', error)
    return error if len(error) <= limit else error[:limit] + '...'


def report(facts: Facts) -> str:
    """The versions, one line each."""
    dists = facts.dists
    lines = [f'Python      {facts.python}',
             f"torch       {facts.torch} (CUDA {facts.torch_cuda or 'none: a CPU build'}), torchvision "
             f"{facts.others.get('torchvision')}"]
    # compiled ops that load were built for this torch: built for another, they fail on its symbols
    ops = {'cuda': f'compiled, CUDA {facts.mmcv_cuda}, load with torch {facts.torch}',
           'cpu': f'compiled, CPU only, load with torch {facts.torch}',
           None: f'not loadable ({_short(facts.mmcv_ops_error or "")})'}[facts.mmcv_ops]
    for name in ('mmcv', 'mmengine', 'mmdet', 'mmseg', 'mmpretrain'):
        found = [f'{lib.dist} {dists[lib.dist]}' for lib in (s[name] for s in STACKS.values()) if dists.get(lib.dist)]
        version = facts.imported.get(name)
        what = ', '.join(found) or ('(no distribution)' if version else 'not installed')
        installed = [dists[lib.dist] for lib in (s[name] for s in STACKS.values()) if dists.get(lib.dist)]
        origin = facts.origins.get(name)
        shadowed = version and installed and version not in installed
        line = f'{name:<11} {what}' + (f' (imports as {version}{" from " + origin if origin else ""})'
                                       if version and (not found or shadowed) else '')
        lines.append(line + (f'; ops: {ops}' if name == 'mmcv' and facts.imported.get('mmcv') else ''))
    lines += [f"timm        {facts.others.get('timm')}", f"mmvisatt    {facts.others.get('mmvisatt')}",
              'GPUs        ' + ('; '.join(facts.gpus) or 'none visible')]
    return '\n'.join(lines)


def forward_failure(error: BaseException, device: str, facts: Facts) -> str:
    """What a failed :func:`smoke_forward` means, with the fix where the error is a known one."""
    text = f'{type(error).__name__}: {error}'
    if 'no kernel image is available' in text:
        caps = [m.group(1)[:-1] + '.' + m.group(1)[-1] for gpu in facts.gpus for m in [re.search(r'sm_(\d+)', gpu)]
                if m]
        arch = ';'.join(sorted(set(caps))) or '<your GPU\'s compute capability, e.g. 8.0 for an A100>'
        dist = next((d for d in ('onedl-mmcv', 'mmcv') if facts.dists.get(d)), 'mmcv')
        return (f"mmcv's CUDA ops have no kernel for this GPU ({'; '.join(facts.gpus) or device}): the installed "
                f'{dist} was compiled for other GPU architectures. The onedl fork\'s prebuilt CUDA wheels, for '
                'example, cover 7.5, 8.6, 8.9, 9.0 and 12.0 without PTX, so they do not run on an A100 (8.0). Build '
                f'mmcv from its sdist for this GPU: pip uninstall -y {dist} && TORCH_CUDA_ARCH_LIST="{arch}" '
                f'MMVISATT_VENV=none bash tools/setup_env.sh --user ({_short(text)})')
    return f'The forward on {device} failed: {text}'


def smoke_forward(config: str, device: str, size: int = 320) -> Dict[str, Any]:
    """Build ``config`` (ReSwin-T Mask R-CNN; no pretrained weights) and run its prediction on one random
    ``size`` x ``size`` image on ``device``: the backbone, the RPN's NMS, RoIAlign in the box and mask heads.
    Returns the device, the seconds of the forward and the number of detections."""
    from mmengine.config import Config
    from mmengine.registry import MODELS, DefaultScope

    from mmvisatt.checkpoint.fit import drop_pretrained_init
    from mmvisatt.engine.entrypoints import import_task_library
    cfg = Config.fromfile(config)
    drop_pretrained_init(cfg)
    scope = import_task_library(cfg)
    from mmdet.structures import DetDataSample
    with DefaultScope.overwrite_default_scope(scope):
        model = MODELS.build(cfg.model).to(device).eval()
        sample = DetDataSample(metainfo=dict(img_shape=(size, size), ori_shape=(size, size), scale_factor=(1., 1.),
                                             pad_shape=(size, size), batch_input_shape=(size, size)))
        inputs = torch.randint(0, 256, (3, size, size), dtype=torch.uint8)
        start = time.perf_counter()
        with torch.no_grad():
            data = model.data_preprocessor(dict(inputs=[inputs], data_samples=[sample]), False)
            results = model(**data, mode='predict')
        if device.startswith('cuda'):
            torch.cuda.synchronize()
    return dict(device=device, seconds=time.perf_counter() - start, config=osp.basename(config),
                detections=len(results[0].pred_instances))
