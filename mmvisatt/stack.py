"""Which OpenMMLab stack is installed, and whether this package supports it.

Two stacks install the same import names (``mmcv``, ``mmengine``, ``mmdet``, ``mmseg``, ``mmpretrain``): upstream
OpenMMLab's last releases, and the maintained fork published as ``onedl-*`` distributions. Their version lines do
not overlap (upstream mmcv ends at 2.2.0, the fork's starts at 2.3), and upstream's task libraries refuse the fork's
mmcv at import, so one environment holds one stack. ``import mmvisatt`` calls :func:`check_stack`, which stops with
what was found, what is accepted and the fix, as mmdet does for mmcv.

Standard library only, so that ``tools/setup_plan.py`` reads the same ranges before anything is installed.
"""
import importlib
from importlib import metadata
from typing import Dict, List, Mapping, NamedTuple, Optional, Tuple

Version = Tuple[int, ...]


class Library(NamedTuple):
    """One library of a stack: its distribution name and the releases supported, ``low <= v < high``."""
    dist: str
    low: str
    high: str

    def accepts(self, version: str) -> bool:
        return parse(self.low) <= parse(version) < parse(self.high)

    def requirement(self) -> str:
        return f'{self.dist}>={self.low},<{self.high}'


#: import name -> the library of each stack. The upstream ranges are what mmdet 3.3 and mmsegmentation 1.2 accept
#: (mmcv < 2.2.0); the fork's are its current release lines, on which the suite runs too.
STACKS: Dict[str, Dict[str, Library]] = {
    'openmmlab': dict(
        mmcv=Library('mmcv', '2.0.0', '2.2.0'),
        mmengine=Library('mmengine', '0.10.0', '1.0.0'),
        mmdet=Library('mmdet', '3.3.0', '3.4.0'),
        mmseg=Library('mmsegmentation', '1.2.2', '1.3.0'),
        mmpretrain=Library('mmpretrain', '1.2.0', '1.3.0'),
    ),
    'onedl': dict(
        mmcv=Library('onedl-mmcv', '2.3.0', '2.4.0'),
        mmengine=Library('onedl-mmengine', '0.10.8', '1.0.0'),
        mmdet=Library('onedl-mmdetection', '3.5.0', '3.6.0'),
        mmseg=Library('onedl-mmsegmentation', '1.4.0', '1.5.0'),
        mmpretrain=Library('onedl-mmpretrain', '1.3.0', '1.4.0'),
    ),
}
#: what each stack is called in messages
STACK_NAMES = {'openmmlab': 'upstream OpenMMLab', 'onedl': 'the onedl fork'}
#: the libraries ``import mmvisatt`` needs; the task libraries are checked where installed
REQUIRED = ('mmcv', 'mmengine')
TASK_LIBRARIES = ('mmdet', 'mmseg', 'mmpretrain')
FIX = ('tools/setup_env.sh installs either stack into a new environment (MMVISATT_STACK=openmmlab or onedl); in an '
       "existing one, pip install -e '.[mim]' for upstream or -e '.[onedl]' for the fork, with the matching mmcv "
       '(docs/getting_started.md, "Install")')


class UnsupportedStackError(ImportError):
    """The installed mmcv / mmengine / task libraries are outside what this package supports."""


def parse(version: str) -> Version:
    """``'2.1.0'`` -> ``(2, 1, 0)``; a local or pre-release suffix counts as the release (``'0.10.8rc1'`` ->
    ``(0, 10, 8)``)."""
    parts = []
    for part in version.split('+')[0].split('.')[:3]:
        digits = ''
        for char in part:
            if not char.isdigit():
                break
            digits += char
        parts.append(int(digits) if digits else 0)
    return tuple(parts + [0] * (3 - len(parts)))


def installed_distributions() -> Dict[str, Optional[str]]:
    """The version of each stack's distribution of every library (None where not installed)."""
    found = {}
    for libraries in STACKS.values():
        for library in libraries.values():
            try:
                found[library.dist] = metadata.version(library.dist)
            except metadata.PackageNotFoundError:
                found[library.dist] = None
    return found


def stack_of(dists: Mapping[str, Optional[str]]) -> Optional[str]:
    """``'openmmlab'``, ``'onedl'``, ``'mixed'`` (distributions of both), or None (neither) for the
    distributions in ``dists`` (:func:`installed_distributions`)."""
    held = [name for name, libraries in STACKS.items() if any(dists.get(lib.dist) for lib in libraries.values())]
    return None if not held else held[0] if len(held) == 1 else 'mixed'


def _accepted(name: str) -> str:
    return ' or '.join(f'{stack[name].requirement()} ({STACK_NAMES[key]})' for key, stack in STACKS.items())


def stack_problems(imported: Mapping[str, Optional[str]], dists: Mapping[str, Optional[str]]) -> List[str]:
    """What is wrong with a stack, as sentences naming what was found and what is accepted; empty when it is
    supported. ``imported``: the ``__version__`` of each required library as it imports (None: it does not);
    ``dists``: :func:`installed_distributions`."""
    problems = []
    missing = [name for name in REQUIRED if not imported.get(name)]
    if missing:
        return [f"{' and '.join(missing)} cannot be imported: this package needs "
                + '; '.join(f'{name} ({_accepted(name)})' for name in missing)]
    mixed = [(STACKS['openmmlab'][name].dist, STACKS['onedl'][name].dist) for name in REQUIRED + TASK_LIBRARIES
             if dists.get(STACKS['openmmlab'][name].dist) and dists.get(STACKS['onedl'][name].dist)]
    for upstream, fork in mixed:
        problems.append(f'both {upstream} {dists[upstream]} and {fork} {dists[fork]} are installed: they write the '
                        f'same files, so neither can be trusted; uninstall both and reinstall one')
    mmcv = imported['mmcv']
    stack = next((key for key, libs in STACKS.items() if libs['mmcv'].accepts(mmcv)), None)
    if stack is None:
        problems.append(f'mmcv {mmcv} is installed; accepted: {_accepted("mmcv")}')
        return problems
    wanted = STACKS[stack]
    if not wanted['mmengine'].accepts(imported['mmengine']):
        problems.append(f"mmengine {imported['mmengine']} is installed beside mmcv {mmcv} ({STACK_NAMES[stack]}); "
                        f"accepted: {wanted['mmengine'].requirement()}")
    for name in TASK_LIBRARIES:
        for key, libs in STACKS.items():
            version = dists.get(libs[name].dist)
            if not version:
                continue
            if key != stack:
                problems.append(f'{libs[name].dist} {version} ({STACK_NAMES[key]}) is installed beside mmcv {mmcv} '
                                f'({STACK_NAMES[stack]}); with it use {wanted[name].requirement()}')
            elif not libs[name].accepts(version):
                problems.append(f'{libs[name].dist} {version} is installed; accepted: {libs[name].requirement()}')
        # what Python imports, where another copy (an old checkout on PYTHONPATH) comes before the installed one
        shadow = imported.get(name)
        if shadow and not wanted[name].accepts(shadow):
            installed = ', '.join(f'{libs[name].dist} {dists[libs[name].dist]}' for libs in STACKS.values()
                                  if dists.get(libs[name].dist)) or 'no distribution'
            problems.append(f'{name} imports as {shadow} ({installed} installed): another copy comes first on '
                            f'sys.path (an old checkout on PYTHONPATH?); accepted: {wanted[name].requirement()}')
    return problems


def _imported_version(name: str) -> Optional[str]:
    try:
        return importlib.import_module(name).__version__
    except ImportError:
        return None


def check_stack() -> str:
    """Stop with :class:`UnsupportedStackError` unless mmcv, mmengine and the installed task libraries are one
    supported stack; returns the stack's key (``'openmmlab'`` or ``'onedl'``)."""
    imported = {name: _imported_version(name) for name in REQUIRED}
    problems = stack_problems(imported, installed_distributions())
    if problems:
        raise UnsupportedStackError('mmvisatt cannot run on the installed OpenMMLab stack:\n- '
                                    + '\n- '.join(problems) + f'\nFix: {FIX}')
    return next(key for key, libs in STACKS.items() if libs['mmcv'].accepts(imported['mmcv']))
