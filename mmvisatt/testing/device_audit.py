"""What a training step would do on a GPU, measured without one.

A backbone built under ``torch.device('meta')`` runs its forward and backward with shapes alone: anything that
reads a value back to the host (``.item()``, ``.tolist()``, a data-dependent branch, ``nonzero``) fails there by
itself. :class:`StepAudit`, a ``TorchDispatchMode`` over the step, adds the two things the meta device lets pass:

* every ATen op the step dispatches is counted (on a GPU each is at least one kernel launch, so a count that
  grows with the batch is a Python loop the GPU waits on);
* every tensor an op takes or makes on another device than the input's is recorded: a tensor built on the host
  and copied over, which on a GPU is a blocking host-to-device copy in every step.

:func:`count_compiles` runs a step under ``torch.compile`` with dynamic shapes at several input sizes (on the
meta device too: a tracing backend needs no values) and counts the graphs compiled, so recompiles show.

:class:`LiveBytes` counts the bytes of the tensors alive over a step and their peak: what CUDA's caching allocator
reports as ``max_memory_allocated``, measured on any device (``tools/analysis/config_memory.py``).

``tests/test_gpu_readiness.py`` and ``tools/analysis/gpu_readiness.py`` (the table in docs/performance.md) both
read :func:`audit_training_step`.
"""
import weakref
from collections import Counter
from typing import Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
from mmengine.registry import MODELS
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

import mmvisatt.models  # noqa: F401  (registers the backbones)


class StepAudit(TorchDispatchMode):
    """Counts the ATen ops dispatched under it and records tensors on devices other than ``device``."""

    def __init__(self, device: Union[str, torch.device]):
        super().__init__()
        self.device = torch.device(device)
        self.ops: Counter = Counter()
        self.foreign: List[Tuple[str, str, Tuple[int, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = str(func.overloadpacket)
        self.ops[name] += 1
        for where, tensors in (('input', tree_leaves((args, kwargs))), ('output', tree_leaves(out))):
            for t in tensors:
                if isinstance(t, torch.Tensor) and t.device != self.device:
                    self.foreign.append((f'{name} {where}', str(t.device), tuple(t.shape)))
        return out

    @property
    def total(self) -> int:
        return sum(self.ops.values())


class LiveBytes(TorchDispatchMode):
    """The bytes of the tensors alive (``live``) and their most at once (``peak``) while it is active: each storage
    an op makes counts from its creation to its release, once however many views it has. Tensors made before
    (weights, the batch) count once :meth:`add` is given them. What CUDA's caching allocator reports as allocated,
    without its rounding to 512-byte blocks, and without the workspaces kernels allocate inside an op."""

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = 0
        self._sizes: WeakIdKeyDictionary = WeakIdKeyDictionary()

    def add(self, tensors: Iterable) -> None:
        for t in tree_leaves(tensors):
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            if storage in self._sizes:
                continue
            nbytes = self.nbytes(t)
            self._sizes[storage] = nbytes
            self.live += nbytes
            self.peak = max(self.peak, self.live)
            weakref.finalize(storage, self._release, nbytes)

    def nbytes(self, t: torch.Tensor) -> int:
        """The bytes ``t``'s storage counts for (a subclass may count another dtype than the one it has)."""
        return t.untyped_storage().nbytes()

    def _release(self, nbytes: int) -> None:
        self.live -= nbytes

    def reset_peak(self) -> None:
        self.peak = self.live

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.add(out)
        return out


class StepReport(NamedTuple):
    """One audited training step: ``ops`` ATen ops in all, ``by_op`` per op, ``foreign`` (op and role, device,
    shape) of every tensor met on another device than the input's."""
    ops: int
    by_op: Dict[str, int]
    foreign: List[Tuple[str, str, Tuple[int, ...]]]


def build_on_device(name: str, arch: Union[str, dict], device: Union[str, torch.device] = 'meta',
                    **kwargs) -> nn.Module:
    """A registered backbone constructed under ``torch.device(device)`` (deferred initialisation: no weight is
    made on the host), in training mode."""
    with torch.device(device):
        model = MODELS.get(name)(arch=arch, **kwargs)
    return model.train()


def _step(model: nn.Module, x: torch.Tensor) -> None:
    outs = model(x)
    outs = outs if isinstance(outs, (tuple, list)) else (outs, )
    sum(o.float().mean() for o in outs).backward()


def audit_training_step(model: nn.Module, batch: int, height: int, width: int,
                        device: Optional[Union[str, torch.device]] = None, warm: bool = True) -> StepReport:
    """Audit one forward + backward of ``model`` on a (batch, 3, height, width) input on ``device`` (default: the
    model's). ``warm`` runs the step once first, so caches of shape-derived geometry are filled as in training."""
    device = torch.device(device) if device is not None else next(model.parameters()).device
    x = torch.empty(batch, 3, height, width, device=device)
    if warm:
        _step(model, x)
    model.zero_grad(set_to_none=True)
    audit = StepAudit(device)
    with audit:
        _step(model, x)
    model.zero_grad(set_to_none=True)
    return StepReport(audit.total, dict(audit.ops), audit.foreign)


def count_compiles(model: nn.Module, sizes: Sequence[Tuple[int, int]], batch: int = 2,
                   device: Optional[Union[str, torch.device]] = None, backend: str = 'aot_eager') -> List[int]:
    """Graphs Dynamo has compiled (cumulative, its ``unique_graphs`` count) after a training step of
    ``torch.compile(model, dynamic=True)`` at each of ``sizes``: the first entry is the first compile (more than
    one where the step breaks into several graphs), every later increase a recompile. Resets Dynamo before and
    after."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    device = torch.device(device) if device is not None else next(model.parameters()).device
    torch._dynamo.reset()
    counters.clear()
    try:
        compiled = torch.compile(model, backend=backend, dynamic=True)
        graphs = []
        for height, width in sizes:
            _step(compiled, torch.empty(batch, 3, height, width, device=device))
            model.zero_grad(set_to_none=True)
            graphs.append(counters['stats']['unique_graphs'])
        return graphs
    finally:
        torch._dynamo.reset()


__all__ = ['LiveBytes', 'StepAudit', 'StepReport', 'audit_training_step', 'build_on_device', 'count_compiles']
