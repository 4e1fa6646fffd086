"""Training that survives being killed: atomic checkpoints, a ``--resume auto`` that skips incomplete files, and
an exact resume (the random number generators continue where the checkpointed run left them).

mmengine 0.10.7 writes a checkpoint in place (``open(path, 'wb')``) and deletes the checkpoints beyond
``max_keep_ckpts`` *before* writing the new one, so a job killed while saving can be left with a truncated newest
file, or with none at all; ``find_latest_checkpoint`` then resumes from whatever ``last_checkpoint`` names. Here:

* :class:`AtomicLocalBackend` (registered as file backend ``'atomic_local'``) writes to a temporary file in the
  same directory, fsyncs it and renames it over the target, so a file under a checkpoint's name is always complete.
* :class:`AtomicCheckpointHook` is mmengine's ``CheckpointHook`` on that backend, deleting outdated checkpoints
  only after the new one is on disk. ``tools/train.py`` swaps it in for ``CheckpointHook``
  (:func:`enable_reliable_training`).
* :func:`find_resumable_checkpoint` picks the newest *complete* checkpoint of a work dir for ``--resume auto``.
* :class:`ExactResumeHook` stores every rank's RNG states in the checkpoint and puts them back at the exact point of
  the resumed run where the interrupted run had them, so that a killed and resumed run ends with the same weights as
  an uninterrupted one (bitwise on CPU with ``randomness=dict(seed=..., deterministic=True)`` and an
  ``IterBasedTrainLoop``). mmengine restores everything else: weights, optimizer, schedulers, message hub, and for an
  ``IterBasedTrainLoop`` the data position (it replays the dataloader up to the checkpointed iteration).
* :class:`PreemptionHook` turns SIGTERM (what Slurm sends on preemption and at the time limit) and SIGUSR1
  (``sbatch --signal=USR1@SECONDS``) into a checkpoint at the next iteration boundary on every rank and a clean exit
  (:class:`TrainingPreempted`); ``--resume`` continues exactly from it.

The tests kill runs on purpose to check all of the above (``tests/fault_injection.py``).
"""
import contextlib
import errno
import glob
import multiprocessing
import os
import os.path as osp
import random
import re
import shutil
import signal
import tempfile
import threading
import zipfile
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np
import torch
from mmengine.config import Config, ConfigDict
from mmengine.dist import all_gather_object, all_reduce, get_rank, get_world_size
from mmengine.fileio import LocalBackend, register_backend
from mmengine.hooks import CheckpointHook, Hook
from mmengine.logging import print_log
from mmengine.registry import HOOKS

from mmvisatt.checkpoint import load_checkpoint_file

ATOMIC_BACKEND = 'atomic_local'
# AtomicCheckpointHook's mid-epoch checkpoints: their file names, and the message hub key of those kept
MID_EPOCH_TEMPLATE = 'iter_{}.pth'
MID_EPOCH_KEY = 'keep_mid_epoch_ckpt_ids'
# Temporary files are named ``.<target name>.<random>.partial`` next to their target.
PARTIAL_SUFFIX = '.partial'


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


class CheckpointWriteError(OSError):
    """A checkpoint (or another file of the run) could not be written: the disk is full, a quota or a file-size
    limit was hit. The previous file of that name is kept."""


def write_failure(path: str, size: int, error: OSError) -> str:
    directory = osp.dirname(osp.abspath(path))
    free = shutil.disk_usage(directory).free
    cause = {errno.ENOSPC: 'the disk is full', errno.EDQUOT: 'the disk quota is used up',
             errno.EFBIG: 'the file is larger than the file system allows'}.get(error.errno, error.strerror)
    return (f'could not write {path} ({size / 2 ** 20:.1f} MiB): {cause} ({free / 2 ** 30:.2f} GiB free on '
            f'{directory}). Nothing was overwritten (the previous file of that name, if any, is intact). Free some '
            f'space or move the work dir (--work-dir) to a larger disk, keep fewer checkpoints '
            f'(--cfg-options default_hooks.checkpoint.max_keep_ckpts=2), then resume with --resume.')


def atomic_write(data: bytes, path: str) -> None:
    """Write ``data`` to ``path`` so that ``path`` holds either its old content or all of ``data``, never a part.

    The bytes go to a temporary file in the same directory (a rename is atomic only within a file system), which is
    flushed and fsynced before it is renamed over ``path``; the directory is fsynced too so that the rename itself
    survives a power cut. A crash leaves at most a ``*.partial`` file behind, which nothing reads.
    """
    directory = osp.dirname(osp.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f'.{osp.basename(path)}.', suffix=PARTIAL_SUFFIX, dir=directory)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600 files; give the permissions open() would
        with os.fdopen(fd, 'wb') as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as error:
        if osp.exists(tmp):
            os.remove(tmp)
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
            raise CheckpointWriteError(write_failure(path, len(data), error)) from error
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class AtomicLocalBackend(LocalBackend):
    """mmengine's local file backend with atomic :meth:`put` / :meth:`put_text` (see :func:`atomic_write`).

    Select it with ``backend_args=dict(backend='atomic_local')`` wherever mmengine takes ``backend_args``.
    """

    def put(self, obj: bytes, filepath: Union[str, os.PathLike]) -> None:
        atomic_write(obj, str(filepath))

    def put_text(self, obj: str, filepath: Union[str, os.PathLike], encoding: str = 'utf-8') -> None:
        atomic_write(obj.encode(encoding), str(filepath))


register_backend(ATOMIC_BACKEND, AtomicLocalBackend, force=True)


class _DeferredRemoval:
    """A file backend stand-in that queues ``remove`` / ``rmtree`` until :meth:`flush`."""

    def __init__(self, backend: Any) -> None:
        self._backend = backend
        self._pending: List[Tuple[str, str]] = []

    def remove(self, path: str) -> None:
        self._pending.append(('remove', path))

    def rmtree(self, path: str) -> None:
        self._pending.append(('rmtree', path))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def flush(self) -> None:
        for method, path in self._pending:
            getattr(self._backend, method)(path)
        self._pending.clear()


@HOOKS.register_module()
class AtomicCheckpointHook(CheckpointHook):
    """``CheckpointHook`` whose checkpoints are written atomically, deleting outdated ones only afterwards, and
    which can also save inside the epochs of an epoch-based run.

    Takes every argument of mmengine's ``CheckpointHook``. Local paths (the default, or
    ``backend_args=dict(backend='local')``) use :class:`AtomicLocalBackend`; another backend (e.g. a cloud store)
    is used as given, since its atomicity is its own. ``last_checkpoint`` is rewritten atomically after the
    checkpoint it names is complete.

    Args:
        mid_epoch_interval: with ``by_epoch=True``, also save ``iter_N.pth`` every this many iterations (counted
            from the start of training) unless the iteration ends an epoch, whose own checkpoint follows. 0: never.
            ``ResumableEpochBasedTrainLoop`` resumes these at the next batch of their epoch.
        mid_epoch_max_keep: how many of the newest mid-epoch checkpoints to keep (-1: all); the epoch
            checkpoints keep ``max_keep_ckpts`` of their own.
    """

    def __init__(self, *args, backend_args: Optional[dict] = None, file_client_args: Optional[dict] = None,
                 mid_epoch_interval: int = 0, mid_epoch_max_keep: int = 2, **kwargs) -> None:
        if file_client_args is None and (backend_args is None or backend_args.get('backend') == 'local'):
            backend_args = dict(backend_args or {}, backend=ATOMIC_BACKEND)
        super().__init__(*args, backend_args=backend_args, file_client_args=file_client_args, **kwargs)
        if mid_epoch_interval < 0 or mid_epoch_max_keep == 0 or mid_epoch_max_keep < -1:
            raise ValueError('AtomicCheckpointHook: mid_epoch_interval must be >= 0 and mid_epoch_max_keep >= 1 '
                             f'or -1, got {mid_epoch_interval} and {mid_epoch_max_keep}')
        self.mid_epoch_interval, self.mid_epoch_max_keep = mid_epoch_interval, mid_epoch_max_keep
        self._mid_epoch_steps: List[int] = []
        self._saved_iter = -1  # the iteration of the newest checkpoint this hook wrote

    def before_train(self, runner) -> None:
        super().before_train(runner)
        self._mid_epoch_steps = list(runner.message_hub.runtime_info.get(MID_EPOCH_KEY, []))
        if runner.rank == 0 and isinstance(self.file_backend, LocalBackend):
            # left by a process that died while writing; their targets were never replaced
            for partial in glob.glob(osp.join(glob.escape(self.out_dir), f'.*{PARTIAL_SUFFIX}')):
                print_log(f'removing {partial}, an unfinished checkpoint write', logger='current')
                with contextlib.suppress(FileNotFoundError):
                    os.remove(partial)

    def _save_checkpoint_with_step(self, runner, step, meta):
        backend = self.file_backend
        self.file_backend = _DeferredRemoval(backend)
        try:
            super()._save_checkpoint_with_step(runner, step, meta)
            deferred = self.file_backend
        finally:
            self.file_backend = backend
        last = osp.join(runner.work_dir, 'last_checkpoint')
        if runner.rank == 0 and osp.isfile(last) and isinstance(self.last_ckpt, str):
            # mmengine wrote it in place; make it durable too before anything old is deleted
            atomic_write(self.last_ckpt.encode(), last)
        deferred.flush()
        self._saved_iter = int(meta['iter'])

    def saves_at_epoch_end(self, runner, batch_idx: int) -> bool:
        """Whether this iteration ends an epoch whose checkpoint (if any) :meth:`after_train_epoch` writes."""
        return self.by_epoch and batch_idx + 1 == len(runner.train_loop.dataloader)

    def saves_mid_epoch(self, runner, batch_idx: int) -> bool:
        """Whether :meth:`after_train_iter` writes a mid-epoch checkpoint after this iteration."""
        return (self.by_epoch and self.mid_epoch_interval > 0
                and self.every_n_train_iters(runner, self.mid_epoch_interval)
                and batch_idx + 1 < len(runner.train_loop.dataloader))

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        super().after_train_iter(runner, batch_idx, data_batch, outputs)
        if self.saves_mid_epoch(runner, batch_idx):
            runner.logger.info(f'Saving checkpoint at {runner.iter + 1} iterations (inside epoch '
                               f'{runner.epoch + 1})')
            self._save_mid_epoch_checkpoint(runner)
        preemption = _stopping(runner)
        if preemption is None or self.saves_at_epoch_end(runner, batch_idx):
            return
        if self._saved_iter != runner.iter + 1:
            runner.logger.info(f'{preemption.signal_name}: saving checkpoint at {runner.iter + 1} iterations')
            if self.by_epoch:
                self._save_mid_epoch_checkpoint(runner)
            else:
                self._save_checkpoint(runner)
        raise preemption.stopped(runner, self.last_ckpt, runner.iter + 1)

    def after_train_epoch(self, runner) -> None:
        super().after_train_epoch(runner)
        preemption = _stopping(runner)
        if preemption is None or not self.by_epoch:
            return
        if self._saved_iter != runner.iter:
            runner.logger.info(f'{preemption.signal_name}: saving checkpoint at {runner.epoch + 1} epochs')
            self._save_checkpoint(runner)
        raise preemption.stopped(runner, self.last_ckpt, runner.iter)

    def save_between_iterations(self, runner, why: str) -> None:
        """Write the checkpoint of the training state between two iterations (during a validation), named as this
        hook names the one after the last iteration, unless that one is on disk already. mmengine names a
        checkpoint from inside the iteration or epoch it ends, before the loop counts it: the count is held back
        while it saves."""
        if self._saved_iter == runner.iter:
            return
        runner.logger.info(f'{why}: saving checkpoint at {runner.iter} iterations')
        loop = runner.train_loop
        counter = '_epoch' if self.by_epoch else '_iter'
        setattr(loop, counter, getattr(loop, counter) - 1)
        try:
            self._save_checkpoint(runner)
        finally:
            setattr(loop, counter, getattr(loop, counter) + 1)

    def _save_mid_epoch_checkpoint(self, runner) -> None:
        """``iter_N.pth``, atomically as every checkpoint; the oldest beyond ``mid_epoch_max_keep`` is deleted once
        the new one and ``last_checkpoint`` are on disk."""
        step = runner.iter + 1
        self._mid_epoch_steps.append(step)
        outdated = []
        if self.mid_epoch_max_keep > 0:
            outdated = self._mid_epoch_steps[:-self.mid_epoch_max_keep]
            self._mid_epoch_steps = self._mid_epoch_steps[-self.mid_epoch_max_keep:]
        runner.message_hub.update_info(MID_EPOCH_KEY, list(self._mid_epoch_steps))
        name = MID_EPOCH_TEMPLATE.format(step)
        self.last_ckpt = self.file_backend.join_path(self.out_dir, name)
        runner.message_hub.update_info('last_ckpt', self.last_ckpt)
        runner.save_checkpoint(self.out_dir, name, self.file_client_args, save_optimizer=self.save_optimizer,
                               save_param_scheduler=self.save_param_scheduler, meta=dict(epoch=runner.epoch, iter=step),
                               by_epoch=False, backend_args=self.backend_args, **self.args)
        self._saved_iter = step
        if runner.rank != 0:
            return
        atomic_write(self.last_ckpt.encode(), osp.join(runner.work_dir, 'last_checkpoint'))
        for old in outdated:
            path = self.file_backend.join_path(self.out_dir, MID_EPOCH_TEMPLATE.format(old))
            if self.file_backend.isfile(path):
                self.file_backend.remove(path)


def checkpoint_problem(path: str) -> Optional[str]:
    """Why ``path`` is not a complete ``torch.save`` checkpoint, or None if it is.

    ``torch.save`` writes a zip archive whose directory is at the end of the file, so a truncated file has none;
    every member's CRC is checked as well, which catches a file whose middle was not written.
    """
    if not osp.isfile(path):
        return 'missing'
    if osp.getsize(path) == 0:
        return 'empty (0 bytes)'
    try:
        with zipfile.ZipFile(path) as archive:
            if not any(name.endswith('data.pkl') for name in archive.namelist()):
                return 'not a torch.save archive (no data.pkl)'
            bad = archive.testzip()
            if bad is not None:
                return f'corrupt member {bad}'
    except zipfile.BadZipFile as error:
        return f'incomplete or corrupt ({error}; was the job killed while writing it?)'
    return None


def _step_of(path: str) -> int:
    match = re.search(r'(\d+)\.pth$', osp.basename(path))
    return int(match.group(1)) if match else -1


def _iteration_of(path: str) -> int:
    """The iteration a checkpoint was written at: the number of ``iter_N.pth``, the ``meta`` of any other file
    (memory-mapped: no tensor is read); -1 for a file that cannot be read."""
    if osp.basename(path).startswith('iter_'):
        return _step_of(path)
    try:
        return int(load_checkpoint_file(path, 'cpu', mmap=True)['meta']['iter'])
    except Exception:  # incomplete or foreign files are reported by checkpoint_problem
        return -1


def find_resumable_checkpoint(work_dir: str) -> Tuple[Optional[str], List[Tuple[str, str]]]:
    """The newest complete checkpoint in ``work_dir`` and the newer ones that were skipped, with the reason.

    Candidates are the file ``last_checkpoint`` names and every ``epoch_*.pth`` / ``iter_*.pth``, newest first
    (by the number in the name, then by modification time; by the iteration when epoch and mid-epoch checkpoints
    are mixed); the first complete one wins.
    """
    candidates = glob.glob(osp.join(work_dir, 'epoch_*.pth')) + glob.glob(osp.join(work_dir, 'iter_*.pth'))
    last_file = osp.join(work_dir, 'last_checkpoint')
    if osp.isfile(last_file):
        with open(last_file) as f:
            named = f.read().strip()
        if named and named not in candidates and osp.isfile(named):
            candidates.append(named)
    names = {osp.basename(p).split('_')[0] for p in candidates}
    step = _iteration_of if {'epoch', 'iter'} <= names else _step_of
    candidates.sort(key=lambda p: (step(p), osp.getmtime(p)), reverse=True)
    skipped = []
    for path in candidates:
        problem = checkpoint_problem(path)
        if problem is None:
            return path, skipped
        skipped.append((path, problem))
    return None, skipped


class NothingToResumeError(FileNotFoundError):
    """``--resume``: the work dir's ``last_checkpoint`` names a checkpoint, and no complete one is left."""


def resolve_auto_resume(cfg: Config) -> Config:
    """``--resume auto``: resume from :func:`find_resumable_checkpoint` of ``cfg.work_dir``; start afresh where
    there is none (a new work dir, or only incomplete files, each named in a warning); stop
    (:class:`NothingToResumeError`) where ``last_checkpoint`` names a file that was deleted and none is left, instead
    of silently training from the start over the run's history."""
    found, skipped = find_resumable_checkpoint(cfg.work_dir)
    for path, problem in skipped:
        print_log(f'--resume: skipping {path}: {problem}', logger='current', level=30)
    last_file = osp.join(cfg.work_dir, 'last_checkpoint')
    named = ''
    if found is None and osp.isfile(last_file):
        with open(last_file) as f:
            named = f.read().strip()
    if named and not osp.isfile(named):
        raise NothingToResumeError(
            f'--resume: {last_file} names {named}, which no longer exists, and {cfg.work_dir} holds no other complete '
            f'checkpoint{" (skipped: " + ", ".join(osp.basename(p) for p, _ in skipped) + ")" if skipped else ""}. '
            f'Starting over would overwrite last_checkpoint and the run\'s history. To resume, put the checkpoint '
            f'back (or pass --resume PATH of a copy); to train from the start in this work dir, delete {last_file} '
            f'or run without --resume.')
    if found is None:
        print_log(f'--resume: no complete checkpoint in {cfg.work_dir}; training from the start', logger='current')
        # resume=True without a path makes mmengine read last_checkpoint, harmless only when there is none
        cfg.resume = not osp.exists(osp.join(cfg.work_dir, 'last_checkpoint'))
        cfg.load_from = None
    else:
        print_log(f'--resume: resuming from {found}', logger='current')
        cfg.resume, cfg.load_from = True, found
    return cfg


def enable_reliable_training(cfg: Config, resume: Optional[str] = None) -> Config:
    """What ``tools/train.py`` adds to every training config: atomic checkpoints (``CheckpointHook`` ->
    :class:`AtomicCheckpointHook`), :class:`ExactResumeHook`, :class:`~.hooks.ChannelCheckHook` and
    :class:`~.hooks.BackboneLayoutHook`, unless the config already has them; and what ``--resume`` asks for
    (``resume``: ``'auto'``, the newest complete checkpoint in the work dir (:func:`resolve_auto_resume`), or a
    path)."""
    if resume == 'auto':
        resolve_auto_resume(cfg)
    elif resume is not None:
        cfg.resume, cfg.load_from = True, resume
    checkpoint = (cfg.get('default_hooks') or {}).get('checkpoint')
    if isinstance(checkpoint, dict) and checkpoint.get('type') in ('CheckpointHook', 'mmengine.CheckpointHook'):
        checkpoint['type'] = 'AtomicCheckpointHook'
    return add_custom_hooks(cfg, 'ExactResumeHook', 'PreemptionHook', 'ChannelCheckHook', 'BackboneLayoutHook')


def add_custom_hooks(cfg: Config, *types: str) -> Config:
    """Append ``dict(type=T)`` to ``cfg.custom_hooks`` for each of ``types`` the config does not have yet."""
    hooks = list(cfg.get('custom_hooks') or [])
    present = {h.get('type') for h in hooks if isinstance(h, dict)}
    hooks += [ConfigDict(type=t) for t in types if t not in present]
    cfg.custom_hooks = hooks
    return cfg


def get_rng_states() -> Dict[str, Any]:
    """This process's Python, numpy and torch RNG states, in types ``torch.load(weights_only=True)`` accepts."""
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    states: Dict[str, Any] = dict(
        python=random.getstate(),
        numpy=dict(name=name, keys=torch.from_numpy(keys.astype(np.int64)), pos=int(pos), has_gauss=int(has_gauss),
                   cached_gaussian=float(gauss)),
        torch=torch.get_rng_state())
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states['cuda'] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: Dict[str, Any]) -> None:
    """Inverse of :func:`get_rng_states`."""
    version, internal, gauss = states['python']
    random.setstate((version, tuple(internal), gauss))
    npy = states['numpy']
    np.random.set_state((npy['name'], npy['keys'].numpy().astype(np.uint32), npy['pos'], npy['has_gauss'],
                         npy['cached_gaussian']))
    torch.set_rng_state(states['torch'])
    if 'cuda' in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states['cuda'])


class _RestoreAfter:
    """Wraps a train loop's data iterator: after ``skip`` batches, restores the RNG states and unwraps itself.

    Upstream mmengine's ``IterBasedTrainLoop`` replays the skipped batches through ``next``; the onedl fork's calls
    the iterator's ``skip_iter(n)``, which moves the sampler on without loading them. Either way the states are set
    once the skipped batches are behind, where the uninterrupted run stood when it saved."""

    def __init__(self, loop: Any, skip: int, states: Dict[str, Any]) -> None:
        self._loop, self._inner, self._left, self._states = loop, loop.dataloader_iterator, skip, states

    def __iter__(self):
        return self

    def __next__(self):
        batch = next(self._inner)
        self._left -= 1
        if self._left == 0:
            self._restore()
        return batch

    def skip_iter(self, num_iters: int) -> None:
        self._inner.skip_iter(num_iters)
        self._left -= num_iters
        if self._left <= 0:
            self._restore()

    def _restore(self) -> None:
        set_rng_states(self._states)
        self._loop.dataloader_iterator = self._inner


class TrainingPreempted(SystemExit):
    """The run was asked to stop (SIGTERM / SIGUSR1) and saved a checkpoint first; ``code`` is the exit status a
    process ended by that signal has (128 + its number), the message says where the checkpoint is."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(128 + signum)
        self.message, self.signum = message, signum

    def __str__(self) -> str:
        return self.message


PREEMPTION_SIGNALS = ('SIGTERM', 'SIGUSR1')


class WorkerIgnoresStopSignals:
    """A dataloader's ``worker_init_fn`` that keeps the worker through the stop signals, then runs ``init_fn``.

    Slurm signals every process of a job step, dataloader workers included; torch's worker handler ends a worker on
    SIGTERM, and the trainer's next batch then fails before its checkpoint is written. This worker ignores SIGUSR1,
    and SIGTERM while the trainer trains; once the trainer has left training (``released``, a flag it sets), a
    SIGTERM ends the worker as torch's handler would, so that the trainer's exit (which terminates its workers and
    waits for them) completes."""

    def __init__(self, init_fn: Optional[Any] = None, released: Optional[Any] = None) -> None:
        self.init_fn, self.released = init_fn, released

    def __call__(self, worker_id: int) -> None:
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, self._terminated)
        if self.init_fn is not None:
            self.init_fn(worker_id)

    def _terminated(self, signum: int, frame: Any) -> None:
        if self.released is None or self.released.value:
            os._exit(0)


@HOOKS.register_module()
class PreemptionHook(Hook):
    """Stop on SIGTERM or SIGUSR1 with a checkpoint, instead of dying with the work since the last one.

    Slurm sends SIGTERM when it preempts a job or its time is up, and SIGKILL ``KillWait`` seconds later (30 by
    default); with ``sbatch --signal=USR1@SECONDS`` it sends SIGUSR1 that many seconds before the time limit. The
    handler (installed by :func:`handling_preemption` around ``runner.train()``) only records the signal; at the
    next iteration boundary at which the ranks compare notes, every rank stops at the same iteration,
    :class:`AtomicCheckpointHook` writes the checkpoint there (inside an epoch: a mid-epoch checkpoint, which
    ``ResumableEpochBasedTrainLoop`` resumes exactly; at an epoch's end: the epoch checkpoint), and the run ends with
    :class:`TrainingPreempted`.

    Args:
        sync_interval: with several processes, the ranks all-reduce their flag (one int32, one host sync) every this
            many iterations and stop at the first such iteration after any rank got the signal; a single process
            checks its flag (a Python bool) after every iteration.
    """

    priority = 'NORMAL'  # before ExactResumeHook ('LOW') captures the RNG states for the checkpoint

    def __init__(self, sync_interval: int = 10) -> None:
        if sync_interval < 1:
            raise ValueError(f'PreemptionHook: sync_interval must be >= 1, got {sync_interval}')
        self.sync_interval = sync_interval
        self.received: Optional[int] = None
        self.stopping: Optional[int] = None  # the signal the ranks agreed to stop on

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.stopping or self.received or signal.SIGTERM).name

    def request(self, signum: int, frame: Any = None) -> None:
        """The signal handler: remember the signal; the hook acts on it at an iteration boundary."""
        if self.received is None:
            self.received = signum
            print_log(f'{signal.Signals(signum).name} received: saving a checkpoint at the next iteration boundary '
                      '(of training or validation), then stopping', logger='current', level=30)

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        if self.stopping is not None:
            return
        if get_world_size() == 1:
            self.stopping = self.received
        elif self.every_n_train_iters(runner, self.sync_interval):
            flags = torch.tensor([self.received or 0], dtype=torch.int32)
            all_reduce(flags, op='max')
            self.stopping = int(flags.item()) or None
        if self.stopping is not None and not any(isinstance(h, AtomicCheckpointHook) for h in runner.hooks):
            raise TrainingPreempted(
                f'{self.signal_name} at iteration {runner.iter + 1}: stopped without a checkpoint, since the config '
                'saves none (default_hooks.checkpoint is not a CheckpointHook).', int(self.stopping))

    def after_val_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        """A signal during a validation inside training stops it at the next validation iteration (the ranks compare
        notes every ``sync_interval`` of them): the training state is between iterations, and its checkpoint is
        written unless it is on disk already (an epoch's, just before its validation)."""
        loop = getattr(runner, '_train_loop', None)
        if self.stopping is not None or loop is None or isinstance(loop, dict):
            return
        if get_world_size() == 1:
            self.stopping = self.received
        elif (batch_idx + 1) % self.sync_interval == 0:
            flags = torch.tensor([self.received or 0], dtype=torch.int32)
            all_reduce(flags, op='max')
            self.stopping = int(flags.item()) or None
        if self.stopping is None:
            return
        saver = next((h for h in runner.hooks if isinstance(h, AtomicCheckpointHook)), None)
        if runner.iter == 0:
            raise TrainingPreempted(f'{self.signal_name} while validating before the first iteration: nothing to save; '
                                    'run the same command again.', int(self.stopping))
        if saver is None:
            raise TrainingPreempted(
                f'{self.signal_name} while validating after iteration {runner.iter}: stopped without a checkpoint, '
                'since the config saves none (default_hooks.checkpoint is not a CheckpointHook).', int(self.stopping))
        runner.logger.info(f'{self.signal_name}: stopping the validation after its batch {batch_idx + 1}')
        saver.save_between_iterations(runner, self.signal_name)
        raise self.stopped(runner, saver.last_ckpt, runner.iter)

    def stopped(self, runner, checkpoint: str, iteration: int) -> TrainingPreempted:
        """The exception that ends the run, saying where the checkpoint of ``iteration`` (1-based) is."""
        return TrainingPreempted(
            f'{self.signal_name} at iteration {iteration}: saved {checkpoint}. Run the same command with '
            f'--resume to continue from it (tools/train.py CONFIG --work-dir {runner.work_dir} --resume).',
            int(self.stopping))


def _stopping(runner) -> Optional[PreemptionHook]:
    """The run's :class:`PreemptionHook` if its ranks have agreed to stop, else None."""
    for hook in runner.hooks:
        if isinstance(hook, PreemptionHook) and hook.stopping is not None:
            return hook
    return None


@contextlib.contextmanager
def handling_preemption(runner):
    """Route SIGTERM and SIGUSR1 to the runner's :class:`PreemptionHook` while the block runs (main thread only:
    Python delivers signals there), and make the dataloader workers the runner builds meanwhile ignore them
    (:class:`WorkerIgnoresStopSignals`); the previous handlers are put back afterwards."""
    hook = next((h for h in runner.hooks if isinstance(h, PreemptionHook)), None)
    if hook is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    signums = [getattr(signal, name) for name in PREEMPTION_SIGNALS]
    previous = {s: signal.signal(s, hook.request) for s in signums}
    build_dataloader = runner.build_dataloader
    released = multiprocessing.Value('b', 0, lock=False)

    def workers_ignore_stop_signals(*args, **kwargs):
        loader = build_dataloader(*args, **kwargs)
        if getattr(loader, 'num_workers', 0) > 0:
            loader.worker_init_fn = WorkerIgnoresStopSignals(loader.worker_init_fn, released)
        return loader
    # the loops build their dataloaders in runner.train(), and an iteration-based loop starts its workers there
    runner.build_dataloader = workers_ignore_stop_signals
    try:
        yield
    finally:
        released.value = 1
        del runner.build_dataloader
        for s, handler in previous.items():
            signal.signal(s, handler)


def _checkpoint_due_after_iter(runner, batch_idx: int) -> bool:
    stopping = _stopping(runner) is not None
    for hook in runner.hooks:
        if stopping and isinstance(hook, AtomicCheckpointHook) and not hook.saves_at_epoch_end(runner, batch_idx):
            return True  # the preemption checkpoint
        if isinstance(hook, AtomicCheckpointHook) and hook.saves_mid_epoch(runner, batch_idx):
            return True
        if isinstance(hook, CheckpointHook) and not hook.by_epoch:
            if (hook.interval > 0 and hook.every_n_train_iters(runner, hook.interval, hook.save_begin)) or \
                    (hook.save_last and hook.is_last_train_iter(runner)):
                return True
    return False


@HOOKS.register_module()
class ExactResumeHook(Hook):
    """Save every rank's RNG states in each checkpoint and restore them on resume, where they were taken.

    States are gathered from all ranks right before a checkpoint is written (``after_train_iter`` /
    ``after_train_epoch``, ahead of the checkpoint hook) and stored under ``checkpoint['rng_states']`` (a list
    indexed by rank). On resume they are set again:

    * ``IterBasedTrainLoop``: right after mmengine has replayed the dataloader up to the checkpointed iteration,
      i.e. where the uninterrupted run stood when it saved (replaying consumes random numbers in data loading);
    * ``ResumableEpochBasedTrainLoop`` resumed inside an epoch: right after it has started the epoch's dataloader
      iterator (past the consumed batches), where the interrupted run stood when it saved; at an epoch boundary with
      persistent dataloader workers also after the iterator has started (starting the workers draws their base
      seed from the main generator, which the uninterrupted run, reusing its workers, does not);
    * other epoch-based loops: at the start of the resumed epoch. mmengine's ``EpochBasedTrainLoop`` resumes at
      epoch boundaries only; a checkpoint from the middle of an epoch restarts that epoch, so that resume is not
      exact and a warning says so.

    A checkpoint written with a different number of processes, or without states, resumes as before (with a
    warning). ``load_from`` (weights only) never touches the RNGs.
    """

    priority = 'LOW'  # after the other hooks of an iteration, before CheckpointHook ('VERY_LOW')

    def __init__(self) -> None:
        self._captured: Optional[Tuple[int, List[Dict[str, Any]]]] = None
        self._pending: Optional[Tuple[int, Any]] = None

    def _capture(self, step: int) -> None:
        self._captured = (step, all_gather_object(get_rng_states()))

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        if _checkpoint_due_after_iter(runner, batch_idx):
            self._capture(runner.iter + 1)

    def after_train_epoch(self, runner) -> None:
        self._capture(runner.iter)

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        if self._captured is not None and self._captured[0] == checkpoint['meta'].get('iter'):
            checkpoint['rng_states'] = self._captured[1]

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        self._pending = (checkpoint.get('meta', {}).get('iter', -1), checkpoint.get('rng_states'))

    def before_train_epoch(self, runner) -> None:
        if self._pending is None:
            return
        step, states = self._pending
        self._pending = None
        if step != runner.iter or step <= 0:
            return  # load_from: weights only
        if states is None or len(states) != get_world_size():
            why = 'has no RNG states' if states is None else f'was written by {len(states)} processes'
            print_log(f'ExactResumeHook: the checkpoint {why}; resuming with fresh RNG states (the rest of the run '
                      'will not repeat the interrupted one exactly)', logger='current', level=30)
            return
        mine = states[get_rank()]
        loop = runner.train_loop
        if hasattr(loop, 'dataloader_iterator'):  # IterBasedTrainLoop: it replays `iter` batches next
            loop.dataloader_iterator = _RestoreAfter(loop, runner.iter, mine)
            return
        if hasattr(loop, 'rng_states_after_iterator') and loop.resumed_batches():
            # ResumableEpochBasedTrainLoop continuing inside the epoch: the states were taken after the epoch's
            # dataloader iterator had started
            loop.rng_states_after_iterator = mine
            return
        if hasattr(loop, 'rng_states_after_iterator') and loop.dataloader.num_workers > 0 and \
                loop.dataloader.persistent_workers:
            # at an epoch boundary: the uninterrupted run reuses its persistent workers for the next epoch, drawing
            # nothing from the main generator, while this run starts them, which draws their base seed
            loop.rng_states_after_iterator = mine
            return
        if runner.iter != runner.epoch * len(loop.dataloader):
            print_log(f'ExactResumeHook: checkpoint from iteration {runner.iter}, inside epoch {runner.epoch + 1}: '
                      f'{type(loop).__name__} restarts that epoch, so the resumed run is not an exact continuation; '
                      'use ResumableEpochBasedTrainLoop (mmvisatt.engine), IterBasedTrainLoop or epoch-end '
                      'checkpoints for exact resumes', logger='current', level=30)
        set_rng_states(mine)


__all__ = ['atomic_write', 'AtomicLocalBackend', 'AtomicCheckpointHook', 'checkpoint_problem',
           'find_resumable_checkpoint', 'resolve_auto_resume', 'enable_reliable_training', 'get_rng_states',
           'set_rng_states', 'ExactResumeHook', 'PreemptionHook', 'TrainingPreempted',
           'NothingToResumeError',
           'handling_preemption', 'ATOMIC_BACKEND', 'add_custom_hooks']
