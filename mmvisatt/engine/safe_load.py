"""Let torch >= 2.6 ``weights_only`` loading read the checkpoints mmengine 0.10.7 writes.

torch 2.6 switched ``torch.load`` to ``weights_only=True``; mmengine 0.10.7 still calls it without the argument,
so ``--resume``, ``load_from`` and ``tools/test.py`` fail on mmengine's own checkpoints. Those checkpoints hold, next
to tensors, a few plain Python objects: the message hub's ``HistoryBuffer`` (numpy arrays of logged scalars plus its
statistics methods, pickled as ``getattr(HistoryBuffer, 'mean')``) and numpy scalars in the runtime info (``eta``).
Everything else in them (``OrderedDict``, ``Counter`` in ``MultiStepLR`` state, tensors) torch already allows.

Instead of turning the safety check off, the exact types found in saved checkpoints are allowlisted. ``getattr`` is
allowlisted only in a form that returns methods defined on ``HistoryBuffer`` itself, so a checkpoint cannot use it
to reach anything else.
"""
import pickle
from types import FunctionType
from typing import Any, Callable, List, Tuple, Union

import numpy as np
import torch
from mmengine.logging import HistoryBuffer

SafeGlobal = Union[Callable, Tuple[Callable, str]]


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


def mmengine_checkpoint_globals() -> List[SafeGlobal]:
    """Everything beyond torch's defaults that an mmengine 0.10.7 training checkpoint contains."""
    return [HistoryBuffer, (history_buffer_method, 'builtins.getattr')] + _numpy_globals()


def register_mmengine_safe_globals() -> None:
    """Allowlist :func:`mmengine_checkpoint_globals` for ``torch.load(weights_only=True)``; idempotent."""
    if hasattr(torch.serialization, 'add_safe_globals'):  # torch >= 2.4; older torch does not need it
        torch.serialization.add_safe_globals(mmengine_checkpoint_globals())
