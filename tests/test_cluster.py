"""On a shared cluster: preemption keeps the work (SIGTERM / SIGUSR1 -> a checkpoint at the next iteration, exact
resume), one run per work dir, URL checkpoints that cannot load the wrong file or hang, phone photos, and the
smaller refusals of the same path. See docs/reliability.md."""
import contextlib
import errno
import io
import json
import logging
import os
import signal
import re
import socket
import struct
import subprocess
import zlib

import numpy as np
import pytest
import torch
from mmengine.logging import MMLogger
from PIL import Image

import fault_injection  # noqa: F401  (FaultInjectionHook, for the runs made in this process)
from conftest import REPO
from mmvisatt.checkpoint import (CheckpointDownloadError, CheckpointMismatchError, download, download_checkpoint,
                                 load_checkpoint_file, url_cache_path)
from mmvisatt.datasets.transforms import CorruptImageError
from mmvisatt.engine import entrypoints
from mmvisatt.engine.preflight import (AnnotationError, WorkDirError, WorkDirInUseError, WorkDirLock,
                                       check_dataset_contents, claim_work_dir, work_dir)
from mmvisatt.engine.preflight.work_dir import LOCK_NAME as LOCK
from test_preflight import _coco_folder, _det_cfg
from test_weights import _Server
from mmvisatt.engine.reliability import NothingToResumeError, TrainingPreempted
from test_reliability import (FAULT, NO_VAL, RESUME_OPTIONS, _assert_bitwise_equal, _ckpt, _epoch_run,  # noqa: F401
                              _run, epoch_based_config, tiny_configs)


# ---------------------------------------------------------------------------------------------------------------
# Preemption
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_sigterm_saves_at_the_next_iteration_and_resumes_exactly(tiny_configs, tmp_path):  # noqa: F811
    """SIGTERM arrives before iteration 3 (checkpoints every 2), to the trainer and its dataloader worker, as Slurm
    signals every process of a job step: the worker keeps serving batches, the run finishes iteration 3, saves
    iter_3.pth, says so and exits with 143; --resume continues from it to the reference's weights, bit for bit."""
    config = tiny_configs['mask_rcnn']
    _run(config, tmp_path / 'reference', RESUME_OPTIONS)
    work = tmp_path / 'preempted'
    log = _run(config, work, RESUME_OPTIONS + FAULT + ['default_hooks.fault.at_iter=3',
                                                       'default_hooks.fault.children=True',
                                                       f'default_hooks.fault.sig={int(signal.SIGTERM)}'],
               expect_kill=128 + signal.SIGTERM)
    assert 'SIGTERM received: saving a checkpoint at the next iteration boundary' in log
    assert 'killed by signal' not in log
    assert f'stopped: SIGTERM at iteration 3: saved {work / "iter_3.pth"}. Run the same command with --resume' \
        in log
    assert 'Traceback' not in log
    assert sorted(n for n in os.listdir(work) if n.endswith('.pth')) == ['iter_3.pth']  # max_keep_ckpts=1
    log = _run(config, work, RESUME_OPTIONS, extra=['--resume'])
    assert f'--resume: resuming from {work / "iter_3.pth"}' in log
    _assert_bitwise_equal(_ckpt(tmp_path / 'reference' / 'iter_6.pth'), _ckpt(work / 'iter_6.pth'))


@pytest.mark.slow
def test_every_rank_and_worker_signalled_under_dist_train_exits_preempted(tiny_configs, tmp_path):  # noqa: F811
    """Slurm's preemption as it comes: SIGTERM to every process of the step (torchrun, both ranks, their dataloader
    workers; here each rank signals itself and its worker before iteration 3, and the test torchrun and the
    script). Both ranks stop at iteration 4 with iter_4.pth on disk and tools/dist_train.sh exits with 143."""
    config = str(tmp_path / 'sync_every_2.py')
    with open(config, 'w') as f:
        f.write(f"_base_ = [{tiny_configs['mask_rcnn']!r}]\n"
                "custom_hooks = [dict(type='PreemptionHook', sync_interval=2)]\n")
    work = tmp_path / 'preempted'
    log = _run(config, work, RESUME_OPTIONS + FAULT + [
        'default_hooks.fault.at_iter=3', 'default_hooks.fault.children=True', 'default_hooks.fault.parents=True',
        f'default_hooks.fault.sig={int(signal.SIGTERM)}'], procs=2, expect_kill=128 + signal.SIGTERM)
    assert f'stopped: SIGTERM at iteration 4: saved {work / "iter_4.pth"}' in log
    assert 'killed by signal' not in log and len(_ckpt(work / 'iter_4.pth')['rng_states']) == 2


def test_a_signal_during_a_validation_stops_it_with_the_checkpoint_named(tiny_det_config, tmp_path):
    """SIGTERM (to the trainer and its workers) during the validation after iteration 2, whose checkpoint is not
    due (every 4): the validation stops after its second batch of four, iter_2.pth is written and named, exit
    143."""
    with pytest.raises(TrainingPreempted) as stopped:
        entrypoints.train_main([tiny_det_config, '--demo', '--work-dir', str(tmp_path), '--cfg-options',
                                'train_cfg.max_iters=4', 'train_cfg.val_interval=2', 'val_dataloader.dataset.indices=4',
                                'default_hooks.checkpoint.interval=4', 'visualizer.name=validation_stop',
                                *FAULT, 'default_hooks.fault.point=validation', 'default_hooks.fault.at_iter=2',
                                'default_hooks.fault.children=True', f'default_hooks.fault.sig={int(signal.SIGTERM)}'])
    assert stopped.value.code == 128 + signal.SIGTERM
    assert str(stopped.value).startswith(f'SIGTERM at iteration 2: saved {tmp_path / "iter_2.pth"}')
    assert (tmp_path / 'iter_2.pth').is_file() and not (tmp_path / 'iter_4.pth').exists()


def test_a_run_that_saves_no_checkpoint_stops_saying_so(tiny_det_config, tmp_path):
    """A config without a checkpoint hook still stops at the iteration boundary, and says nothing was saved."""
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(TrainingPreempted) as stopped:
        entrypoints.train_main([tiny_det_config, '--demo', '--work-dir', str(tmp_path), '--cfg-options',
                                'default_hooks.checkpoint=None', 'train_cfg.max_iters=3', *NO_VAL, *FAULT,
                                'default_hooks.fault.at_iter=2', f'default_hooks.fault.sig={int(signal.SIGTERM)}'])
    assert stopped.value.code == 128 + signal.SIGTERM
    assert str(stopped.value) == ('SIGTERM at iteration 2: stopped without a checkpoint, since the config saves none '
                                  '(default_hooks.checkpoint is not a CheckpointHook).')
    assert signal.getsignal(signal.SIGTERM) is before  # the handler is gone with the run


@pytest.mark.slow
def test_a_signal_to_one_rank_stops_every_rank_at_the_same_iteration(tiny_configs, tmp_path):  # noqa: F811
    """Two processes under tools/dist_train.sh; only rank 0 and its dataloader worker get SIGUSR1 (Slurm's
    --signal=USR1@SECONDS), before iteration 3. The ranks compare flags every 2 iterations, so both stop after
    iteration 4, whose checkpoint holds both ranks' RNG states, and dist_train.sh exits with 138, the saved stop
    (torchrun alone reports a failure); the resume ends with the uninterrupted run's weights."""
    config = str(tmp_path / 'sync_every_2.py')
    with open(config, 'w') as f:
        f.write(f"_base_ = [{tiny_configs['mask_rcnn']!r}]\n"
                "custom_hooks = [dict(type='PreemptionHook', sync_interval=2)]\n")
    _run(config, tmp_path / 'reference', RESUME_OPTIONS, procs=2)
    work = tmp_path / 'preempted'
    log = _run(config, work, RESUME_OPTIONS + FAULT + [
        'default_hooks.fault.at_iter=3', 'default_hooks.fault.rank=0', 'default_hooks.fault.children=True',
        f'default_hooks.fault.sig={int(signal.SIGUSR1)}'], procs=2, expect_kill=128 + signal.SIGUSR1)
    assert f'stopped: SIGUSR1 at iteration 4: saved {work / "iter_4.pth"}' in log
    assert not (work / 'iter_6.pth').exists()
    assert len(_ckpt(work / 'iter_4.pth')['rng_states']) == 2
    _run(config, work, RESUME_OPTIONS, procs=2, extra=['--resume'])
    _assert_bitwise_equal(_ckpt(tmp_path / 'reference' / 'iter_6.pth'), _ckpt(work / 'iter_6.pth'))


@pytest.mark.slow
def test_an_epoch_based_run_stops_inside_or_at_an_epoch_end_and_resumes(epoch_based_config, tmp_path):  # noqa: F811
    """The shipped COCO loop (ResumableEpochBasedTrainLoop), 2 epochs of 5 batches, epoch checkpoints every 2 epochs:
    SIGTERM before iteration 3 saves the mid-epoch iter_3.pth; before iteration 5, the epoch's last, saves
    epoch_1.pth after the epoch (not a mid-epoch file past its end). Both resume to the reference's weights."""
    options = ['train_dataloader.dataset.indices=10', 'default_hooks.checkpoint.interval=2',
               'default_hooks.checkpoint.mid_epoch_interval=0']
    _epoch_run(epoch_based_config, tmp_path / 'reference', options, tmp_path / 'reference.loads')
    for at_iter, saved in ((3, 'iter_3.pth'), (5, 'epoch_1.pth')):
        work = tmp_path / f'at_{at_iter}'
        log = _epoch_run(epoch_based_config, work, options + FAULT + [
            f'default_hooks.fault.at_iter={at_iter}', f'default_hooks.fault.sig={int(signal.SIGTERM)}'],
            tmp_path / f'{at_iter}.loads', expect_kill=128 + signal.SIGTERM)
        assert f'stopped: SIGTERM at iteration {at_iter}: saved {work / saved}' in log
        assert sorted(n for n in os.listdir(work) if n.endswith('.pth')) == [saved]
        _epoch_run(epoch_based_config, work, options, tmp_path / f'{at_iter}.resumed', extra=['--resume'])
        _assert_bitwise_equal(_ckpt(tmp_path / 'reference' / 'epoch_2.pth'), _ckpt(work / 'epoch_2.pth'))


# ---------------------------------------------------------------------------------------------------------------
# One run per work dir
# ---------------------------------------------------------------------------------------------------------------
HOLD = """import sys, time
from mmvisatt.engine.preflight import claim_work_dir
with claim_work_dir(sys.argv[1]):
    print('held', flush=True)
    time.sleep(120)
"""


def test_a_second_run_into_a_work_dir_in_training_is_refused(tiny_det_config, tmp_path, python):
    """A live run holds the work dir (its lock, as train_main takes it): tools/train.py into the same folder stops
    before its Runner is built, naming the running one and the fix; once that run has ended, the folder is free."""
    work = tmp_path / 'work'
    holder = subprocess.Popen([python, '-c', HOLD, str(work)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == 'held'
        with pytest.raises(WorkDirInUseError) as refused:
            entrypoints.train_main([tiny_det_config, '--demo', '--work-dir', str(work)])
        message = str(refused.value)
        assert f'work dir {work} is in use by a run that is training now (host {socket.gethostname()}, ' \
               f'pid {holder.pid}, started 20' in message
        assert 'another --work-dir' in message and '.run.lock' in message
        assert not any(n.endswith('.pth') for n in os.listdir(work))
    finally:
        holder.kill()
        holder.wait()
    with claim_work_dir(str(work)) as lock:  # the dead holder's lock is stale: taken over
        assert json.load(open(lock.path))['pid'] == os.getpid()
    assert not (work / '.run.lock').exists()  # released at the end


def _lock(work, **holder) -> str:
    os.makedirs(work, exist_ok=True)
    path = os.path.join(work, '.run.lock')
    with open(path, 'w') as f:
        json.dump(dict(dict(host=socket.gethostname(), pid=os.getpid(), start='2026-12-05T10:00:00+00:00'), **holder),
                  f)
    return path


def test_stale_locks_are_recognised_on_this_host_and_on_a_shared_file_system(tmp_path, caplog):
    """Same host: a lock whose pid is gone, or is another process now (start time), is stale. Another host: the lock
    counts as live until it has not been refreshed for STALE_AFTER_S seconds by the file system's clock."""
    dead = subprocess.Popen(['true'])
    dead.wait()
    _lock(tmp_path / 'dead', pid=dead.pid)
    _lock(tmp_path / 'reused', pid=os.getpid(), proc_start='1')
    for name in ('dead', 'reused'):
        with claim_work_dir(str(tmp_path / name)):
            pass
    path = _lock(tmp_path / 'other', host='node-17', pid=4242)
    with pytest.raises(WorkDirInUseError, match='host node-17, pid 4242'):
        WorkDirLock(str(tmp_path / 'other')).acquire()
    old = os.stat(path).st_mtime - work_dir.STALE_AFTER_S - 5
    os.utime(path, (old, old))
    with claim_work_dir(str(tmp_path / 'other')) as lock:
        assert json.load(open(lock.path))['host'] == socket.gethostname()
    # the live holder itself (this process, its start time): refused
    _lock(tmp_path / 'live', proc_start=work_dir._process_start(os.getpid()))
    with pytest.raises(WorkDirInUseError):
        WorkDirLock(str(tmp_path / 'live')).acquire()


def test_an_empty_lock_left_by_a_failed_write_is_taken_over(tmp_path):
    """A run that could not write its lock (a full disk) left it empty: a second ago it may be being written (the
    folder is refused), after EMPTY_STALE_S seconds it is stale and taken over."""
    path = tmp_path / LOCK
    path.write_text('')
    with pytest.raises(WorkDirInUseError):
        WorkDirLock(str(tmp_path)).acquire()
    old = os.stat(path).st_mtime - work_dir.EMPTY_STALE_S - 5
    os.utime(path, (old, old))
    with claim_work_dir(str(tmp_path)) as lock:
        assert json.load(open(lock.path))['pid'] == os.getpid()


def test_a_full_disk_when_the_lock_is_written_names_the_path_and_leaves_no_lock(tmp_path, monkeypatch):
    """ENOSPC in the lock's write (injected where the JSON goes into the new file): a WorkDirError naming the lock,
    the system's reason and the fix, and no empty lock that would hold the folder for nobody."""
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(work_dir.json, 'dump', full)
    with pytest.raises(WorkDirError) as refused:
        WorkDirLock(str(tmp_path / 'run')).acquire()
    assert f'cannot write {tmp_path / "run" / LOCK}: No space left on device (errno 28)' in str(refused.value)
    assert 'Free space or choose a writable folder' in str(refused.value)
    assert not (tmp_path / 'run' / LOCK).exists()


def test_a_work_dir_that_is_a_file_or_read_only_is_refused_in_the_preflight(tiny_det_config, tmp_path, monkeypatch):
    """tools/train.py with --work-dir naming a file, or a folder on a read-only file system (EROFS injected where
    the check makes its probe file; as root here, permissions would not refuse it): refused before anything is
    built, with the path and the fix."""
    taken = tmp_path / 'a_file'
    taken.write_text('not a folder')
    with pytest.raises(WorkDirError, match=f'work dir {taken} is a file, not a folder: pass --work-dir a folder'):
        entrypoints.prepare_train([tiny_det_config, '--demo', '--work-dir', str(taken)])

    def read_only(folder):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))
    monkeypatch.setattr(work_dir, '_write_probe', read_only)
    with pytest.raises(WorkDirError, match=r'cannot write .*: Read-only file system \(errno 30\)'):
        entrypoints.prepare_train([tiny_det_config, '--demo', '--work-dir', str(tmp_path / 'new' / 'run')])
    assert not (tmp_path / 'new').exists()


def test_only_rank_0_of_each_launcher_claims_the_work_dir(tmp_path, monkeypatch):
    """Every launcher's rank 1 leaves the folder to rank 0; srun sets SLURM_PROCID, not RANK, before the Runner."""
    for launcher, variable in (('pytorch', 'RANK'), ('slurm', 'SLURM_PROCID'), ('mpi', 'OMPI_COMM_WORLD_RANK')):
        monkeypatch.setenv(variable, '1')
        with claim_work_dir(str(tmp_path), launcher) as lock:
            assert lock is None and not (tmp_path / '.run.lock').exists()
        monkeypatch.setenv(variable, '0')
        with claim_work_dir(str(tmp_path), launcher) as lock:
            assert lock is not None and (tmp_path / '.run.lock').exists()
    monkeypatch.setenv('SLURM_PROCID', '3')  # a single process in a Slurm job, without --launcher slurm
    with claim_work_dir(str(tmp_path), 'none') as lock:
        assert lock is not None


def test_of_runs_claiming_at_once_exactly_one_wins(tmp_path, python):
    """Four processes, ready, then released together: one gets the lock (and holds it a while), three are refused."""
    go = tmp_path / 'go'
    code = ("import os, sys, time\nfrom mmvisatt.engine.preflight import WorkDirLock, WorkDirInUseError\n"
            "print('ready', flush=True)\nwhile not os.path.exists(sys.argv[2]):\n    time.sleep(0.01)\n"
            "try:\n    WorkDirLock(sys.argv[1]).acquire(); print('won', flush=True); time.sleep(3)\n"
            "except WorkDirInUseError:\n    print('refused', flush=True)\n")
    procs = [subprocess.Popen([python, '-c', code, str(tmp_path / 'work'), str(go)], cwd=REPO,
                              stdout=subprocess.PIPE, text=True) for _ in range(4)]
    assert [p.stdout.readline().strip() for p in procs] == ['ready'] * 4
    go.touch()
    results = sorted(p.communicate()[0].strip() for p in procs)
    assert results == ['refused', 'refused', 'refused', 'won']


# ---------------------------------------------------------------------------------------------------------------
# URL checkpoints
# ---------------------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _logged(level=logging.INFO):
    """The records mmengine's current logger emits at ``level`` or above inside the block."""
    records = []
    handler = logging.Handler(level)
    handler.emit = records.append
    logger = MMLogger.get_current_instance()
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)


@pytest.fixture
def server(tmp_path, monkeypatch):
    monkeypatch.setenv('TORCH_HOME', str(tmp_path / 'torch_home'))
    monkeypatch.setattr(download, 'RETRY_WAIT_S', 0.)
    serving = _Server({})
    yield serving
    serving.close()


def _checkpoint_bytes(value: float) -> bytes:
    buffer = io.BytesIO()
    torch.save({'state_dict': {'w': torch.full((4, ), value)}}, buffer)
    return buffer.getvalue()


def _value(path) -> float:
    return float(load_checkpoint_file(path)['state_dict']['w'][0])


def test_two_urls_with_one_file_name_are_two_files(server):
    server.files['/in1k/reswin_t.pth'] = [(200, _checkpoint_bytes(1.))]
    server.files['/in22k/reswin_t.pth'] = [(200, _checkpoint_bytes(22.))]
    with _logged() as records:
        first = download_checkpoint(server.url + '/in1k/reswin_t.pth')
    lines = [r.getMessage() for r in records]
    assert lines[0].startswith(f'Downloading {server.url}/in1k/reswin_t.pth (0.0 MiB) to {first}')
    assert '(100%)' in lines[1] and lines[-1].startswith(f'Downloaded {server.url}/in1k/reswin_t.pth')
    second = download_checkpoint(server.url + '/in22k/reswin_t.pth')
    assert first != second and os.path.basename(second) == 'reswin_t.pth'
    assert (_value(first), _value(second)) == (1., 22.)
    assert download_checkpoint(server.url + '/in1k/reswin_t.pth') == first
    assert server.requests == ['/in1k/reswin_t.pth', '/in22k/reswin_t.pth']  # the third came from the cache


def test_a_cut_download_is_never_cached_and_a_bad_cached_file_is_fetched_again(server):
    full = _checkpoint_bytes(3.)
    url = server.url + '/w.pth'
    server.files['/w.pth'] = [(200, full[:len(full) // 2])]
    with pytest.raises(CheckpointDownloadError) as failed:
        download_checkpoint(url)
    message = str(failed.value)
    assert url in message and 'not a complete checkpoint' in message and url_cache_path(url) in message
    assert not os.path.exists(url_cache_path(url))
    assert os.listdir(os.path.dirname(url_cache_path(url))) == ['.lock']  # no .partial left either
    server.files['/w.pth'] = [(200, full)]  # the server is fixed
    assert _value(download_checkpoint(url)) == 3.
    with open(url_cache_path(url), 'wb') as f:  # cut in the cache, as an older downloader could leave it
        f.write(full[:100])
    assert _value(download_checkpoint(url)) == 3.
    assert server.requests.count('/w.pth') == 3


def test_html_404_and_server_errors(server):
    server.files['/page.pth'] = [(200, b'<!doctype html><html><body>Sign in</body></html>')]
    with pytest.raises(CheckpointDownloadError, match='a web page'):
        download_checkpoint(server.url + '/page.pth')
    assert not os.path.exists(url_cache_path(server.url + '/page.pth'))
    with pytest.raises(CheckpointDownloadError, match=r'HTTP 404: Not Found\. Nothing was cached \(cache path: '):
        download_checkpoint(server.url + '/gone.pth')
    assert server.requests.count('/gone.pth') == 1  # a 404 is not retried
    server.files['/busy.pth'] = [(503, b''), (200, _checkpoint_bytes(5.))]
    assert _value(download_checkpoint(server.url + '/busy.pth')) == 5.  # a 503 is
    server.files['/down.pth'] = [(503, b'')]
    with pytest.raises(CheckpointDownloadError, match=r'HTTP 503: Service Unavailable'):
        download_checkpoint(server.url + '/down.pth')
    assert server.requests.count('/down.pth') == download.ATTEMPTS


def test_a_silent_host_times_out_and_a_refused_connection_is_named(server, tmp_path, monkeypatch):
    silent = socket.socket()
    silent.bind(('127.0.0.1', 0))
    silent.listen()  # accepts connections (the kernel does) and never answers
    url = f'http://127.0.0.1:{silent.getsockname()[1]}/w.pth'
    try:
        with pytest.raises(CheckpointDownloadError) as failed:
            download_checkpoint(url, answer_timeout=0.5, attempts=2)
        # the shipped timeouts, scaled down 20 times: two attempts of 40 s (here 2 s) get no answer, and a third
        # would end past the 90 s deadline, so the host is reported after the second (at 82 s at full scale)
        monkeypatch.setattr(download, 'MIN_ATTEMPT_S', download.MIN_ATTEMPT_S / 20)
        with pytest.raises(CheckpointDownloadError) as late:
            download_checkpoint(url, answer_timeout=download.ANSWER_TIMEOUT_S / 20,
                                no_answer_deadline=download.NO_ANSWER_DEADLINE_S / 20)
        assert re.search(r'answer 2 s, then 60 s per read\); no answer in [45] s of 2 attempts', str(late.value))
    finally:
        silent.close()
    assert 'no answer from 127.0.0.1' in str(failed.value) and 'tried 2 times' in str(failed.value)
    assert [n for n in os.listdir(os.path.dirname(url_cache_path(url))) if n != '.lock'] == []
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    with pytest.raises(CheckpointDownloadError, match=f'http://127.0.0.1:{port}/w.pth: .*Connection refused'):
        download_checkpoint(f'http://127.0.0.1:{port}/w.pth', attempts=1)


def test_a_signed_urls_token_is_never_printed_and_a_new_one_says_it_keeps_another_copy(server):
    """Two signed URLs of one file (tokens abc, def): two cache entries, as the query string may name another file;
    the second download says the cache holds a copy from the same address; no log line or error holds a token; a
    404's fix is to pass the local path where the URL was given (not the backbone's init_cfg: the URL may be a
    test checkpoint)."""
    for token in ('abc123', 'def456'):
        server.files[f'/signed/w.pth?token={token}'] = [(200, _checkpoint_bytes(2.))]
    with _logged() as records:
        first = download_checkpoint(server.url + '/signed/w.pth?token=abc123')
        second = download_checkpoint(server.url + '/signed/w.pth?token=def456')
        with pytest.raises(CheckpointDownloadError) as gone:
            download_checkpoint(server.url + '/signed/gone.pth?token=abc123')
    lines = [r.getMessage() for r in records] + [str(gone.value)]
    assert first != second and not any('abc123' in line or 'def456' in line for line in lines), lines
    assert any(f'{server.url}/signed/w.pth?<query hidden>: the cache holds 1 copy(ies) from this address with '
               f'another query string ({first})' in line for line in lines), lines
    assert 'pass its local path where this URL was given' in str(gone.value) and 'init_cfg' not in str(gone.value)


def test_file_and_s3_checkpoint_uris_are_resolved_or_refused_in_the_preflight(tiny_det_config, tmp_path):
    """``file:///abs/x.pth`` is read as the local file (mmengine would look for a relative path and fail after the
    build); ``s3://`` without petrel_client stops in the pre-flight, naming it and the local alternative."""
    weights = tmp_path / 'backbone.pth'
    torch.save({'state_dict': {}}, weights)
    base = [tiny_det_config, '--demo', '--work-dir', str(tmp_path / 'work'), '--cfg-options',
            'model.backbone.init_cfg.type=Pretrained']
    cfg = entrypoints.prepare_train(base + [f'model.backbone.init_cfg.checkpoint=file://{weights}'])
    assert cfg.model.backbone.init_cfg.checkpoint == str(weights)
    with pytest.raises(FileNotFoundError, match=f'not found: {tmp_path / "gone.pth"}'):
        entrypoints.prepare_train(base + [f'model.backbone.init_cfg.checkpoint=file://{tmp_path / "gone.pth"}'])
    with pytest.raises(FileNotFoundError, match='s3://bucket/reswin_t.pth: mmengine reads s3:// checkpoints through '
                                                'petrel_client'):
        entrypoints.prepare_train(base + ['model.backbone.init_cfg.checkpoint=s3://bucket/reswin_t.pth'])


def test_the_preflight_downloads_and_stops_before_the_runner(server, tiny_det_config, tmp_path):
    url = server.url + '/missing/reswin_t.pth'
    args = [tiny_det_config, '--demo', '--work-dir', str(tmp_path / 'work'), '--cfg-options',
            'model.backbone.init_cfg.type=Pretrained', f'model.backbone.init_cfg.checkpoint={url}']
    with pytest.raises(CheckpointDownloadError) as failed:
        entrypoints.prepare_train(args)
    assert str(failed.value).startswith(f'model.backbone.init_cfg.checkpoint: could not download the checkpoint {url}: '
                                        'HTTP 404')
    server.files['/missing/reswin_t.pth'] = [(200, _checkpoint_bytes(1.))]
    entrypoints.prepare_train(args)
    assert os.path.isfile(url_cache_path(url))


# ---------------------------------------------------------------------------------------------------------------
# Photos
# ---------------------------------------------------------------------------------------------------------------
def _photos(root, stored, annotated, orientation=6, count=2, tagged=None):
    """``count`` JPEGs of ``stored`` size, the first ``tagged`` (default all) with EXIF ``orientation``, annotated
    as ``annotated`` (width, height)."""
    _coco_folder(root, size=annotated, file_size=annotated)
    data = json.loads((root / 'ann.json').read_text())
    data['images'] = [dict(id=i, file_name=f'{i}.jpg', width=annotated[0], height=annotated[1])
                      for i in range(1, count + 1)]
    (root / 'ann.json').write_text(json.dumps(data))
    for i in range(1, count + 1):
        image = Image.new('RGB', stored, (i % 250, 90, 20))
        exif = image.getexif()
        if i <= (count if tagged is None else tagged):
            exif[0x0112] = orientation
        image.save(root / 'images' / f'{i}.jpg', exif=exif)


def test_square_photos_with_an_exif_orientation_stop_the_run_naming_both_fixes(tmp_path):
    """Square: the sizes cannot tell how they were annotated; OpenCV would turn them and training would go on."""
    _photos(tmp_path, (64, 64), (64, 64))
    with pytest.raises(AnnotationError) as refused:
        check_dataset_contents(_det_cfg(tmp_path), 'mmdet')
    message = str(refused.value)
    assert '2 of 2 sampled images of train_dataloader.dataset' in message and '1.jpg (orientation 6)' in message
    assert 'cannot tell' in message
    assert "color_type='color_ignore_orientation'" in message and 'exif_transpose' in message
    ignoring = _det_cfg(tmp_path)
    for split in ('train', 'val', 'test'):
        ignoring[f'{split}_dataloader'].dataset.pipeline[0].color_type = 'color_ignore_orientation'
    assert check_dataset_contents(ignoring, 'mmdet') == []


def test_photos_annotated_on_the_stored_pixels_point_to_loading_them_as_stored(tmp_path):
    _photos(tmp_path, (64, 48), (64, 48))  # annotated as stored; OpenCV would load 48x64
    with pytest.raises(AnnotationError) as refused:
        check_dataset_contents(_det_cfg(tmp_path), 'mmdet')
    message = str(refused.value)
    assert 'EXIF orientation' in message and 'annotated width and height are those of the pixels as stored' in message
    assert 'would not fit the image' not in message
    _photos(tmp_path, (64, 48), (48, 64))  # annotated upright: what the loader gives
    assert check_dataset_contents(_det_cfg(tmp_path), 'mmdet') == []


def test_a_few_oriented_photos_are_a_warning(tmp_path):
    _photos(tmp_path, (64, 64), (64, 64), count=40, tagged=1)
    warnings = check_dataset_contents(_det_cfg(tmp_path), 'mmdet', ('train_dataloader', ))
    assert any('1 of 40 sampled images' in w and 'a warning' in w for w in warnings)


def test_a_very_large_image_passes_the_preflight(tmp_path):
    """A valid 14000x14000 PNG (196 MPixel, above PIL's decompression-bomb limit), built without the pixels."""
    _coco_folder(tmp_path, size=(14000, 14000), file_size=(8, 8))
    side = 14000
    rows = zlib.compressobj(9)
    body = b''.join(rows.compress(b'\0' * (side + 1) * 500) for _ in range(side // 500)) + rows.flush()

    def chunk(kind, data):
        return struct.pack('>I', len(data)) + kind + data + struct.pack('>I', zlib.crc32(kind + data))

    png = (b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', side, side, 8, 0, 0, 0, 0))
           + chunk(b'IDAT', body) + chunk(b'IEND', b''))
    for i in (1, 2):
        (tmp_path / 'images' / f'{i}.jpg').write_bytes(png)
    assert check_dataset_contents(_det_cfg(tmp_path), 'mmdet') == []


# ---------------------------------------------------------------------------------------------------------------
# The smaller refusals
# ---------------------------------------------------------------------------------------------------------------
def test_resume_where_last_checkpoint_names_a_deleted_file_stops(tiny_det_config, tmp_path):
    (tmp_path / 'last_checkpoint').write_text(str(tmp_path / 'iter_2000.pth'))
    with pytest.raises(NothingToResumeError) as refused:
        entrypoints.prepare_train([tiny_det_config, '--demo', '--work-dir', str(tmp_path), '--resume'])
    message = str(refused.value)
    assert f'{tmp_path / "last_checkpoint"} names {tmp_path / "iter_2000.pth"}, which no longer exists' in message
    assert 'without --resume' in message
    os.remove(tmp_path / 'last_checkpoint')  # a work dir that never had a checkpoint: --resume starts afresh
    cfg = entrypoints.prepare_train([tiny_det_config, '--demo', '--work-dir', str(tmp_path), '--resume'])
    assert cfg.load_from is None


@pytest.mark.slow
def test_a_taken_port_gets_a_free_one_or_the_fix(tiny_configs, tmp_path, python):  # noqa: F811
    env = dict(os.environ, PYTHON=python, OMP_NUM_THREADS='1')
    env.pop('PORT', None)
    with socket.socket() as taken:
        taken.bind(('', 0))
        taken.listen()
        port = taken.getsockname()[1]
        run = subprocess.run(['bash', os.path.join(REPO, 'tools', 'dist_train.sh'), tiny_configs['mask_rcnn'], '2'],
                             cwd=REPO, env=dict(env, PORT=str(port)), capture_output=True, text=True, timeout=60)
        assert run.returncode == 1
        assert f'error: PORT={port} is in use on this machine' in run.stderr and f'PORT={port + 1}' in run.stderr
    default = socket.socket()
    with contextlib.suppress(OSError):  # 29500 may be taken already, which is the case under test anyway
        default.bind(('', 29500))
        default.listen()
    try:
        log = _run(tiny_configs['mask_rcnn'], tmp_path / 'work', ['train_cfg.max_iters=1', *NO_VAL], procs=2,
                   env={'PORT': ''})
    finally:
        default.close()
    assert 'dist_train.sh: port 29500 is in use here (another job?): using port ' in log


def test_check_image_integrity_of_an_old_config_still_works_with_a_warning(tmp_path):
    from mmcv.transforms import Compose
    image = tmp_path / 'a.jpg'
    Image.new('RGB', (32, 24), (10, 20, 30)).save(image)
    old = Compose([dict(type='LoadImageFromFile'), dict(type='CheckImageIntegrity')])  # as those configs had it
    assert old(dict(img_path=str(image)))['img'].shape == (24, 32, 3)
    alone = Compose([dict(type='CheckImageIntegrity')])  # in a loader's place: it loads
    assert alone(dict(img_path=str(image)))['img'].shape == (24, 32, 3)
    image.write_bytes(image.read_bytes()[:-200])
    with pytest.raises(CorruptImageError, match='a.jpg'):  # after a loader that decoded what was there
        old.transforms[1](dict(img_path=str(image), img=np.zeros((24, 32, 3), np.uint8)))
    with pytest.raises(CorruptImageError, match='a.jpg'):
        alone(dict(img_path=str(image)))
    from mmvisatt.datasets import transforms
    transforms.CheckImageIntegrity._warned = False
    with _logged(logging.WARNING) as records:
        Compose([dict(type='CheckImageIntegrity')])
        Compose([dict(type='CheckImageIntegrity')])
    assert len(records) == 1
    assert 'CheckImageIntegrity is deprecated' in records[0].getMessage()
    assert "dict(type='LoadCheckedImageFromFile', ...)" in records[0].getMessage()


def test_a_release_file_of_another_preset_is_refused_naming_the_file(tmp_path):
    from mmvisatt.models.backbones.rmt import RMT
    small = dict(embed_dims=(16, 32, 32, 64), depths=(1, 1, 1, 1), num_heads=(2, 2, 4, 4))
    path = str(tmp_path / 'rmt_other_release.pth')
    torch.save({'model': RMT(arch=small, out_norms=False).state_dict()}, path)
    other = RMT(arch=dict(small, embed_dims=(16, 32, 64, 64)), init_cfg=dict(type='Pretrained', checkpoint=path))
    with pytest.raises(CheckpointMismatchError) as refused:
        other.init_weights()
    assert str(refused.value).startswith(path)
