"""One run per work dir: a training run claims its work dir with a lock file, and a second run started into the same
folder is refused before its Runner is built, naming the run that holds it.

Two runs in one work dir overwrite each other's ``iter_N.pth`` / ``epoch_N.pth`` and ``last_checkpoint``, and both
logs report saving them. The lock, ``<work_dir>/.run.lock``, is a small JSON file (host, pid, start time, command)
created with ``O_CREAT | O_EXCL``, which is atomic on local file systems and on NFS v3 and later. While the run
lives, a daemon thread refreshes the file's modification time every :data:`HEARTBEAT_S` seconds; it is removed when
the run ends. A lock left behind by a run that died is stale:

* on the same host, when its pid is gone or belongs to another process now (the start time in ``/proc`` differs);
* on another host (a shared file system, where the pid means nothing here), when the file has not been refreshed
  for :data:`STALE_AFTER_S` seconds. Its age is taken against the file server's clock (the modification time of a
  file written just now in the same folder), so clocks that differ between nodes do not matter.

A lock left empty or unreadable (its run could not write it: a full disk) for :data:`EMPTY_STALE_S` seconds is
stale too, since a run writes its lock right after creating it. A stale lock is taken over with a warning. A work
dir that cannot hold the lock (a file of that name, a read-only or full file system) is refused in the pre-flight
(:func:`check_work_dir`) or when the lock is written, naming the path, the system's reason and the fix.

In a distributed run only rank 0 claims the folder (``RANK`` under torchrun, ``SLURM_PROCID`` under ``--launcher
slurm``, ``OMPI_COMM_WORLD_RANK`` under ``--launcher mpi``).
"""
import contextlib
import datetime
import json
import os
import os.path as osp
import socket
import sys
import tempfile
import threading
from typing import Iterator, Optional

from mmengine.logging import print_log

LOCK_NAME = '.run.lock'
HEARTBEAT_S = 60.
# five missed heartbeats: a live run is never taken for a dead one by a slow file server or a busy node
STALE_AFTER_S = 300.
# a run writes its lock in the same call that creates it: empty for this long, the write failed
EMPTY_STALE_S = 10.


class WorkDirError(RuntimeError):
    """The work dir cannot be used by this run (the message says why and what to do)."""


class WorkDirInUseError(WorkDirError):
    """Another run is training in the work dir this run was started into."""


def _unusable(work_dir: str, path: str, error: OSError) -> WorkDirError:
    reason = error.strerror or str(error)
    return WorkDirError(f'work dir {work_dir}: cannot write {path}: {reason} (errno {error.errno}). Free space or '
                        'choose a writable folder (--work-dir PATH, on a file system this run can write to).')


def check_work_dir(work_dir: str) -> None:
    """Refuse a work dir this run could not write its lock and checkpoints into, before anything is built: a file
    of that name, or a folder (or the nearest existing parent it would be created in) where no file can be made."""
    work_dir = osp.abspath(work_dir)
    if osp.exists(work_dir) and not osp.isdir(work_dir):
        raise WorkDirError(f'work dir {work_dir} is a file, not a folder: pass --work-dir a folder (a new or an '
                           'existing one), or move the file.')
    folder = work_dir
    while not osp.exists(folder):
        folder = osp.dirname(folder)
    if not osp.isdir(folder):
        raise WorkDirError(f'work dir {work_dir}: {folder} is a file, so the folder cannot be made: pass --work-dir '
                           'a path under a folder.')
    try:
        _write_probe(folder)
    except OSError as error:
        raise _unusable(work_dir, folder, error) from None


def _write_probe(folder: str) -> None:
    """Make and remove a file in ``folder``: the OSError says why none can be made there."""
    with tempfile.NamedTemporaryFile(dir=folder, prefix='.write-check.'):
        pass


def _process_start(pid: int) -> Optional[str]:
    """The start time of process ``pid`` in clock ticks since boot (``/proc/<pid>/stat`` field 22), which tells a
    process from a later one that got the same pid; None when there is no such process (or no ``/proc``)."""
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().rsplit(')', 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(pid: int, start: Optional[str]) -> bool:
    current = _process_start(pid)
    if current is not None:
        return start is None or current == start
    if osp.isdir('/proc'):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _age_s(path: str) -> float:
    """Seconds since ``path`` was last modified, by the clock of the file system it is on."""
    with tempfile.NamedTemporaryFile(dir=osp.dirname(path), prefix='.clock.') as probe:
        now = os.fstat(probe.fileno()).st_mtime
    return now - os.stat(path).st_mtime


def _read(path: str) -> Optional[dict]:
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}  # being written right now, or garbage: judged by its age alone


def stale_reason(path: str, holder: dict) -> Optional[str]:
    """Why the lock ``path`` holding ``holder`` belongs to no live run, or None if its run may be alive."""
    host, pid = holder.get('host'), holder.get('pid')
    if not holder:
        age = _age_s(path)
        if age > EMPTY_STALE_S:
            return f'empty or unreadable for {age:.0f} s: the run that made it could not write it (a full disk?)'
        return None
    if host == socket.gethostname() and isinstance(pid, int):
        if not _alive(pid, holder.get('proc_start')):
            return f'process {pid} on this host is gone'
        return None
    age = _age_s(path)
    if age > STALE_AFTER_S:
        return f'not refreshed for {age:.0f} s (a live run refreshes it every {HEARTBEAT_S:.0f} s)'
    return None


def _in_use(work_dir: str, path: str, holder: dict) -> WorkDirInUseError:
    try:
        age = f'{_age_s(path):.0f} s ago'
    except OSError:
        age = 'just now'
    who = (f"host {holder.get('host', '?')}, pid {holder.get('pid', '?')}, started {holder.get('start', '?')}"
           if holder else 'a run whose lock is being written')
    command = f"\n  its command: {holder['command']}" if holder.get('command') else ''
    return WorkDirInUseError(
        f'work dir {work_dir} is in use by a run that is training now ({who}; its lock {path} was refreshed '
        f'{age}).{command}\nTwo runs in one work dir overwrite each other\'s checkpoints and last_checkpoint. Start '
        f'this one with another --work-dir, or stop that run first. If that run is dead on another host, its lock '
        f'counts as stale {STALE_AFTER_S:.0f} s after its last refresh; delete {path} to go on at once.')


class WorkDirLock:
    """The claim of one run on its work dir (see the module's docstring); :meth:`acquire` raises
    :class:`WorkDirInUseError` when a live run holds it."""

    def __init__(self, work_dir: str) -> None:
        self.work_dir = osp.abspath(work_dir)
        self.path = osp.join(self.work_dir, LOCK_NAME)
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def _create(self) -> bool:
        holder = dict(host=socket.gethostname(), pid=os.getpid(), proc_start=_process_start(os.getpid()),
                      start=datetime.datetime.now().astimezone().isoformat(timespec='seconds'),
                      command=' '.join([osp.basename(sys.executable)] + sys.argv))
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        except OSError as error:
            raise _unusable(self.work_dir, self.path, error) from None
        try:
            with os.fdopen(fd, 'w') as f:
                json.dump(holder, f)
        except OSError as error:
            # an empty lock would hold the folder for nobody
            with contextlib.suppress(OSError):
                os.remove(self.path)
            raise _unusable(self.work_dir, self.path, error) from None
        return True

    def _take_over(self, holder: dict, reason: str) -> None:
        """Move the stale lock aside by a rename (atomic: of two runs taking it over, one rename fails), check that
        what was moved is the lock judged stale, and put it back if a live run claimed the folder meanwhile."""
        aside = f'{self.path}.stale.{os.getpid()}'
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return
        if _read(aside) != holder:
            os.rename(aside, self.path)
            return
        os.remove(aside)
        print_log(f"work dir {self.work_dir}: taking over the lock of an ended run (host {holder.get('host', '?')}, "
                  f"pid {holder.get('pid', '?')}, started {holder.get('start', '?')}): {reason}",
                  logger='current', level=30)

    def acquire(self) -> 'WorkDirLock':
        check_work_dir(self.work_dir)
        try:
            os.makedirs(self.work_dir, exist_ok=True)
        except OSError as error:
            raise _unusable(self.work_dir, self.work_dir, error) from None
        for _ in range(3):
            if self._create():
                break
            holder = _read(self.path)
            if holder is None:
                continue  # removed since: try again
            reason = stale_reason(self.path, holder)
            if reason is None:
                raise _in_use(self.work_dir, self.path, holder)
            self._take_over(holder, reason)
        else:
            raise _in_use(self.work_dir, self.path, _read(self.path) or {})
        self._thread = threading.Thread(target=self._heartbeat, daemon=True, name='work-dir-lock')
        self._thread.start()
        return self

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            with contextlib.suppress(OSError):
                os.utime(self.path)

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        holder = _read(self.path)
        if holder and holder.get('pid') == os.getpid() and holder.get('host') == socket.gethostname():
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.path)


# where each launcher puts the global rank before the process group exists (mmengine sets RANK itself for slurm
# and mpi only while it builds the Runner, after the claim)
RANK_VARIABLES = {'pytorch': 'RANK', 'slurm': 'SLURM_PROCID', 'mpi': 'OMPI_COMM_WORLD_RANK'}


def launcher_rank(launcher: Optional[str]) -> int:
    """This process's global rank under ``launcher`` (``tools/train.py --launcher``), read from the environment."""
    name = RANK_VARIABLES.get(launcher or 'none')
    return int(os.environ.get(name, '0')) if name else 0


@contextlib.contextmanager
def claim_work_dir(work_dir: str, launcher: Optional[str] = None) -> Iterator[Optional[WorkDirLock]]:
    """Hold the work dir's lock for the block: rank 0 of a run started by ``launcher`` claims it, the other ranks
    yield None."""
    if launcher_rank(launcher) != 0:
        yield None
        return
    lock = WorkDirLock(work_dir).acquire()
    try:
        yield lock
    finally:
        lock.release()
