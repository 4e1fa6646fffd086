"""FaultInjectionHook: kills a training run on purpose, to test recovery (a test fixture, not part of the package).

The reliability tests' tiny configs list this module in ``custom_imports`` and their runs have ``tests/`` on
``PYTHONPATH``; ``--cfg-options default_hooks.fault.type=FaultInjectionHook default_hooks.fault.at_iter=5`` then
arms it.
"""
import os
import signal
from typing import Optional

from mmengine.dist import get_rank
from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.registry import HOOKS

FAULT_POINTS = ('iteration', 'checkpoint_write', 'validation')


@HOOKS.register_module()
class FaultInjectionHook(Hook):
    """Kill the training process on purpose, to test recovery. Not for real runs.

    Args:
        at_iter: 1-based iteration (as in the log) the fault happens at.
        point: ``'iteration'``: the process dies before iteration ``at_iter`` runs (iterations up to
            ``at_iter - 1`` are done); ``'checkpoint_write'``: it dies inside the write of the checkpoint of
            iteration ``at_iter`` (or of the epoch ending there), once the bytes are in the temporary file and
            before it is renamed: the moment an in-place writer leaves a truncated checkpoint behind;
            ``'validation'``: before the second batch of the validation that follows iteration ``at_iter``.
        rank: the rank that dies (None: every rank). A checkpoint is written by rank 0 only.
        sig: the signal, SIGKILL by default (no clean-up handlers run).
        children: also send it to the process's children (its dataloader workers), as Slurm signals every process
            of a job step.
        parents: rank 0 also sends it to its parent and grandparent (torchrun and tools/dist_train.sh).

    Enable it without editing a config: ``--cfg-options default_hooks.fault.type=FaultInjectionHook
    default_hooks.fault.at_iter=5``.
    """

    priority = 'VERY_HIGH'

    def __init__(self, at_iter: int, point: str = 'iteration', rank: Optional[int] = None,
                 sig: int = int(signal.SIGKILL), children: bool = False, parents: bool = False) -> None:
        if point not in FAULT_POINTS:
            raise ValueError(f'FaultInjectionHook: point must be one of {FAULT_POINTS}, got {point!r}')
        self.at_iter, self.point, self.rank, self.sig = int(at_iter), point, rank, int(sig)
        self.children, self.parents = children, parents

    def _die(self) -> None:
        where = 'before iteration' if self.point == 'iteration' else 'while writing the checkpoint of iteration'
        print_log(f'FaultInjectionHook: sending signal {self.sig} to rank {get_rank()} {where} {self.at_iter}',
                  logger='current', level=30)
        if self.children:
            for task in os.listdir(f'/proc/{os.getpid()}/task'):
                with open(f'/proc/{os.getpid()}/task/{task}/children') as f:
                    for child in f.read().split():
                        os.kill(int(child), self.sig)
        if self.parents and get_rank() == 0:
            parent = os.getppid()
            with open(f'/proc/{parent}/stat') as f:
                grandparent = int(f.read().rsplit(')', 1)[1].split()[1])
            for pid in (parent, grandparent):
                os.kill(pid, self.sig)
        os.kill(os.getpid(), self.sig)

    def _mine(self) -> bool:
        return self.rank is None or self.rank == get_rank()

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        if self.point == 'iteration' and runner.iter + 1 == self.at_iter and self._mine():
            self._die()

    def before_val_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        if self.point == 'validation' and runner.iter == self.at_iter and batch_idx == 1 and self._mine():
            self._die()

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        if self.point == 'checkpoint_write' and checkpoint['meta'].get('iter') == self.at_iter and self._mine():
            # the first fsync of the write comes right after the data went into the temporary file
            os.fsync = lambda fd: self._die()
