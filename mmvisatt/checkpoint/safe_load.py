"""Checkpoints are data: the one loader for every checkpoint file the project reads.

A checkpoint is a pickle, and a pickle can name any importable callable and have the loader call it. torch's
``weights_only=True`` unpickler refuses every global that is not on an allowlist; this module keeps that check on
everywhere (it is never turned off) and widens the allowlist only by *stand-ins*: the name a file refers to is
mapped to a class of ours, so nothing the file names is ever imported or called. What release and training files
carry beside their tensors is read that way:

- ``argparse.Namespace`` (DeiT / RMT / PVT / Shunted ``main.py`` and timm's ``CheckpointSaver`` save ``args``):
  read as a :class:`PickledRecord`, a plain object with the same attributes;
- config objects that are dict subclasses (yacs ``CfgNode`` in Swin's ``config``, mmengine ``ConfigDict``,
  ``addict`` / ``easydict`` dicts): read as ``OrderedDict``;
- ``pathlib`` paths: read as strings;
- numpy scalars and arrays of numeric dtypes, and mmengine's ``HistoryBuffer`` with the statistics methods a pickled
  one refers to (``getattr`` restricted to them): what mmengine 0.10.7 training checkpoints hold.

Anything else is refused with :class:`UnsafeCheckpointError`: the file, the global it names, that nothing was
executed, and what to do. The stand-ins are allowed only while this module loads (torch's ``safe_globals``
context): torch's process-wide allowlist, which other libraries in the process read too, is left as it was.
:func:`register_mmengine_loader` makes :func:`load_checkpoint_file` mmengine's loader for local files; importing
:mod:`mmvisatt.engine` (every config's ``custom_imports``) calls it, so ``init_cfg``, ``load_from``, ``--resume``,
``tools/test.py`` and every tool that goes through mmengine read with it.
"""
import collections
import contextlib
import functools
import os.path as osp
import pickle
import re
from types import FunctionType
from typing import Any, Callable, Iterator, List, Tuple, Union

import numpy as np
import torch
from mmengine.logging import HistoryBuffer
from mmengine.runner.checkpoint import CheckpointLoader

SafeGlobal = Union[Callable, Tuple[Callable, str]]


class UnsafeCheckpointError(pickle.UnpicklingError):
    """A checkpoint file holds more than tensors and plain data; it was refused before anything in it ran."""


class PickledRecord:
    """An object read from a checkpoint as data: the attributes it was saved with (e.g. a training script's
    ``args``), and the name of the class it was saved as, which is never imported."""
    saved_as = 'object'

    def __repr__(self) -> str:
        fields = ', '.join(f'{k}={v!r}' for k, v in vars(self).items())
        return f'{self.saved_as}({fields})'


def _record(qualified_name: str) -> type:
    return type('PickledRecord', (PickledRecord, ), {'saved_as': qualified_name, '__module__': __name__})


class _PlainDict:
    """Stand-in for a dict subclass: unpickling 'constructs' it as a plain ``OrderedDict``, from the dict it was
    reduced to (mmengine's ``ConfigDict``) or empty and then filled item by item (yacs; extra instance attributes
    such as a config's frozen flag land in the dict's ``__dict__``)."""

    def __new__(cls, *args):
        return collections.OrderedDict(args[0] if args and isinstance(args[0], dict) else ())


def _path(*parts: str) -> str:
    """Stand-in for ``pathlib`` paths: the joined string."""
    return osp.join(*parts) if parts else ''


def history_buffer_method(owner: Any, name: str) -> Callable:
    """``getattr`` restricted to the statistics methods a pickled ``HistoryBuffer`` refers to."""
    method = HistoryBuffer.__dict__.get(name) if owner is HistoryBuffer else None
    if name.startswith('_') or not isinstance(method, FunctionType):
        raise pickle.UnpicklingError(
            f'weights_only load: refusing getattr({owner!r}, {name!r}); only public methods of HistoryBuffer '
            f'are allowed')
    return method


def _numpy_globals() -> List[SafeGlobal]:
    multiarray = np._core.multiarray if hasattr(np, '_core') else np.core.multiarray
    reconstruct, scalar = multiarray._reconstruct, multiarray.scalar
    found: List[SafeGlobal] = [np.ndarray, np.dtype]
    # Register each reconstructor under both module paths: a checkpoint written with numpy 1.x names
    # numpy.core.multiarray, one written with numpy 2.x names numpy._core.multiarray.
    for module in ('numpy.core.multiarray', 'numpy._core.multiarray'):
        found += [(reconstruct, f'{module}._reconstruct'), (scalar, f'{module}.scalar')]
    # numpy >= 1.25 gives every dtype its own class; unpickling a dtype BUILDs an instance of that class.
    # Only numeric and bool dtypes: object arrays could smuggle arbitrary objects.
    numeric = [np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
               np.float16, np.float32, np.float64, np.longdouble, np.complex64, np.complex128]
    found += list({type(np.dtype(t)) for t in numeric} - {np.dtype})
    return found


# names that release and training files use for inert containers, read through stand-ins
RECORD_NAMES = ('argparse.Namespace', )
DICT_NAMES = ('yacs.config.CfgNode', 'mmengine.config.config.ConfigDict', 'addict.addict.Dict', 'easydict.EasyDict')
PATH_NAMES = ('pathlib.Path', 'pathlib.PosixPath', 'pathlib.WindowsPath', 'pathlib.PurePosixPath',
              'pathlib.PureWindowsPath')


@functools.lru_cache(maxsize=None)
def checkpoint_globals() -> Tuple[SafeGlobal, ...]:
    """Everything beyond torch's defaults that :func:`load_checkpoint_file` reads: stand-ins for the inert
    containers of release files, and what an mmengine 0.10.7 training checkpoint contains. Built once, so that
    registering it again adds nothing (each stand-in record class would otherwise be a new object)."""
    stand_ins: List[SafeGlobal] = [(_record(name), name) for name in RECORD_NAMES]
    stand_ins += [(_PlainDict, name) for name in DICT_NAMES] + [(_path, name) for name in PATH_NAMES]
    return tuple(stand_ins + [HistoryBuffer, (history_buffer_method, 'builtins.getattr')] + _numpy_globals())


@contextlib.contextmanager
def allowing_stand_ins() -> Iterator[None]:
    """Allowlist :func:`checkpoint_globals` for ``torch.load(weights_only=True)`` inside the block only; what was
    allowlisted before (by anyone) stays allowlisted after it."""
    before = set(torch.serialization.get_safe_globals())
    with torch.serialization.safe_globals([g for g in checkpoint_globals() if g not in before]):
        yield


def _refused_name(message: str) -> str:
    """What torch's weights-only unpickler refused, from its message (never its advice)."""
    match = re.search(r'Unsupported global: GLOBAL ([\w.]+)', message)
    if match:
        return match.group(1)
    detail = message.split('WeightsUnpickler error:', 1)[-1].strip().splitlines()
    return f'an object that is not data ({detail[0].strip()})' if detail and detail[0].strip() else \
        'an object that is not data'


def unsafe_message(path: str, message: str) -> str:
    name = _refused_name(message)
    return (f'Checkpoint {path} holds {name}, which is not data: loading it would import and call code named by '
            f'the file. It was refused before anything in it was imported or executed. Checkpoints are read as '
            f'tensors and plain data only (lists, dicts, numbers, strings, numpy numbers and numeric arrays, argparse '
            f'args and config dicts). If the file comes from a source you trust, load it there and re-save the weights '
            f'alone: torch.save(model.state_dict(), "weights.pth"); then pass that file.')


def load_checkpoint_file(path: str, map_location: Any = 'cpu', mmap: bool = False) -> Any:
    """``torch.load(path, weights_only=True)`` with the stand-ins above; a file that holds more than data raises
    :class:`UnsafeCheckpointError` naming the file and the global. ``~`` is expanded."""
    path = osp.expanduser(path)
    try:
        with allowing_stand_ins():
            return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as error:
        raise UnsafeCheckpointError(unsafe_message(path, str(error))) from None
    except RuntimeError as error:
        if mmap and 'mmap' in str(error):  # a legacy (non-zip) file cannot be memory-mapped
            return load_checkpoint_file(path, map_location)
        raise


def _mmengine_local_loader(filename: str, map_location: Any = None) -> Any:
    filename = osp.expanduser(filename)
    if not osp.isfile(filename):
        raise FileNotFoundError(f'{filename} can not be found.')
    return load_checkpoint_file(filename, map_location)


def _mmengine_url_loader(filename: str, map_location: Any = None) -> Any:
    from .download import download_checkpoint  # (download imports this module)
    return load_checkpoint_file(download_checkpoint(filename), map_location)


def register_mmengine_loader() -> None:
    """Make :func:`load_checkpoint_file` mmengine's loader for local paths and ``http(s)://`` URLs (``load_from``,
    ``--resume``, ``init_cfg`` of mm backbones, ``tools/test.py``); mmengine's own URL loader (torch.hub's) would
    unpickle the download without the weights-only restriction. Called by ``import mmvisatt.engine``, which the
    configs name in ``custom_imports``; ``import mmvisatt.models`` or ``mmvisatt.checkpoint`` leaves mmengine as it
    is."""
    CheckpointLoader.register_scheme(prefixes='', loader=_mmengine_local_loader, force=True)
    CheckpointLoader.register_scheme(prefixes=('http://', 'https://'), loader=_mmengine_url_loader, force=True)


__all__ = ['UnsafeCheckpointError', 'PickledRecord', 'checkpoint_globals', 'allowing_stand_ins',
           'load_checkpoint_file', 'register_mmengine_loader', 'unsafe_message',
           'history_buffer_method']
