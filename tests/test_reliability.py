"""Reliability: killed runs resume exactly, checkpoints are written atomically, a non-finite loss stops training
with a message, one process with batch 2 trains like two with batch 1, bad input gets a clear error, and the data
pipeline keeps up without leaking. See docs/reliability.md."""
import contextlib
import json
import os
import os.path as osp
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import cv2
import numpy as np
import pytest
import torch
from mmengine.config import Config
from mmengine.registry import MODELS

import mmvisatt.models  # noqa: F401  (registers the backbones)
from conftest import CONFIGS, REPO
from mmvisatt.checkpoint import load_checkpoint_file
from mmvisatt.engine import entrypoints, preflight
from mmvisatt.engine.guards import NonFiniteLossError
from mmvisatt.engine.preflight import (AnnotationError, ConfigKeyError, CorruptCheckpointError,
                                       CorruptImageError, check_coco_annotations, explain_image_error)
from mmvisatt.engine.reliability import atomic_write, find_resumable_checkpoint, resolve_auto_resume

TESTS = osp.dirname(osp.abspath(__file__))
NO_VAL = ['val_dataloader=None', 'val_cfg=None', 'val_evaluator=None']
DETERMINISTIC = ['randomness.deterministic=True']
TINY_SWIN = "arch=dict(_delete_=True, embed_dims=16, depths=(1, 1, 1, 1), num_heads=(1, 1, 2, 2))"

# Mask R-CNN with a one-block-per-stage ReSwin and 32-channel heads: every source of randomness of the real recipe
# (drop path, random RPN / RoI samplers, random flips in a dataloader worker), a few MB per checkpoint.
TINY_MASK_RCNN = f"""_base_ = [{osp.join(CONFIGS, 'mask_rcnn_reswin_t_3x.py')!r}]
model = dict(
    backbone=dict({TINY_SWIN}),
    neck=dict(in_channels=[16, 32, 64, 128], out_channels=32),
    rpn_head=dict(in_channels=32, feat_channels=32),
    roi_head=dict(
        bbox_roi_extractor=dict(out_channels=32), bbox_head=dict(in_channels=32, fc_out_channels=64),
        mask_roi_extractor=dict(out_channels=32), mask_head=dict(in_channels=32, conv_out_channels=32)))
"""
# RetinaNet with SyncAvgRetinaHead, whose loss normaliser is averaged over processes.
TINY_RETINANET = f"""_base_ = [{osp.join(CONFIGS, 'retinanet_reswin_t_1x.py')!r}]
model = dict(
    backbone=dict({TINY_SWIN}, drop_path_rate=0.),
    neck=dict(in_channels=[32, 64, 128], out_channels=32),
    bbox_head=dict(in_channels=32, feat_channels=32, stacked_convs=1))
"""
# Semantic FPN: its head has SyncBN, so the distributed run exercises CPUSyncBN.
TINY_SEMANTIC_FPN = f"""_base_ = [{osp.join(CONFIGS, 'fpn_reswin_t_80k_ade20k.py')!r}]
model = dict(
    backbone=dict({TINY_SWIN}, drop_path_rate=0.),
    neck=dict(in_channels=[16, 32, 64, 128], out_channels=32),
    decode_head=dict(in_channels=[32, 32, 32, 32], channels=32, dropout_ratio=0.))
"""


@pytest.fixture(scope='module')
def tiny_configs(tmp_path_factory):
    root = tmp_path_factory.mktemp('reliability_configs')
    paths = {}
    for name, text in (('mask_rcnn', TINY_MASK_RCNN), ('retinanet', TINY_RETINANET),
                       ('semantic_fpn', TINY_SEMANTIC_FPN)):
        paths[name] = str(root / f'tiny_{name}.py')
        with open(paths[name], 'w') as f:
            f.write(text)
        # FaultInjectionHook (tests/fault_injection.py), which FAULT arms
        cfg = Config.fromfile(paths[name])
        cfg.custom_imports.imports.append('fault_injection')
        cfg.dump(paths[name])
    return paths


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def _kill_leftovers(work_dir: str) -> None:
    """Kill processes of a run that outlived it: torchrun starts its workers in sessions of their own, so a killed
    rank's dataloader worker escapes the process group. The work dir, unique to the test, is in its command line."""
    for pid in filter(str.isdigit, os.listdir('/proc')):
        with contextlib.suppress(OSError):
            with open(f'/proc/{pid}/cmdline', 'rb') as f:
                args = f.read().split(b'\0')
            if work_dir.encode() in args and int(pid) != os.getpid():
                os.kill(int(pid), signal.SIGKILL)


def _run(config: str, work_dir, options, procs: int = 1, extra=(), expect_kill: bool = False, demo: bool = True,
         env=None):
    """tools/train.py (or tools/dist_train.sh) in a subprocess, one thread per process: bitwise comparisons need
    the same thread count in every run."""
    env = {**os.environ, 'OMP_NUM_THREADS': '1', 'PYTHON': sys.executable, 'PORT': str(_free_port()), **(env or {})}
    # tests/ for the fault_injection module the tiny configs import
    env['PYTHONPATH'] = os.pathsep.join(filter(None, [TESTS, env.get('PYTHONPATH')]))
    if procs == 1:
        cmd = [sys.executable, osp.join(REPO, 'tools', 'train.py'), config]
    else:
        cmd = ['bash', osp.join(REPO, 'tools', 'dist_train.sh'), config, str(procs)]
    cmd += ['--demo'] * demo + ['--work-dir', str(work_dir), *extra, '--cfg-options', *options]
    log_file = f'{work_dir}.log'
    # Output to a file and a session of its own: a SIGKILLed trainer leaves its dataloader worker behind, blocked
    # for good on its result queue and holding any pipe it inherited; the whole session is killed at the end.
    with open(log_file, 'w') as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            returncode = proc.wait(timeout=600)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            _kill_leftovers(str(work_dir))
    with open(log_file) as f:
        log = f.read()
    if expect_kill is not False and expect_kill is not True:  # an exact exit status
        assert returncode == expect_kill, f'exit status {returncode}:\n' + log[-6000:]
    elif expect_kill:
        assert returncode != 0, 'the fault was not injected:\n' + log[-3000:]
    else:
        assert returncode == 0, log[-6000:]
    return log


def _ckpt(path) -> dict:
    return load_checkpoint_file(str(path))


def _assert_bitwise_equal(a: dict, b: dict) -> None:
    assert a['meta']['iter'] == b['meta']['iter']
    assert a['state_dict'].keys() == b['state_dict'].keys()
    differ = [k for k in a['state_dict'] if not torch.equal(a['state_dict'][k], b['state_dict'][k])]
    assert not differ, f'{len(differ)} tensors differ, e.g. {differ[:5]}'
    state_a, state_b = a['optimizer']['state'], b['optimizer']['state']
    assert state_a.keys() == state_b.keys()
    for key in state_a:
        for name, value in state_a[key].items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(state_b[key][name])), (key, name)


# ---------------------------------------------------------------------------------------------------------------
# 1. Atomic checkpoints, --resume auto, exact resume
# ---------------------------------------------------------------------------------------------------------------

def test_atomic_write_keeps_the_old_file_when_the_write_dies(tmp_path, monkeypatch):
    target = tmp_path / 'iter_2.pth'
    atomic_write(b'old complete checkpoint', str(target))

    def die(fd):
        raise KeyboardInterrupt('killed while writing')

    monkeypatch.setattr(os, 'fsync', die)
    with pytest.raises(KeyboardInterrupt):
        atomic_write(b'new' * 1000, str(target))
    assert target.read_bytes() == b'old complete checkpoint'
    assert os.listdir(tmp_path) == ['iter_2.pth']  # the temporary file is gone too
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask  # as open() would create it, not mkstemp's 0600


@pytest.mark.parametrize('code, cause', [(28, 'the disk is full'),
                                         (27, 'the file is larger than the file system allows')])
def test_a_failed_checkpoint_write_names_the_file_and_size(tmp_path, monkeypatch, code, cause):
    from mmvisatt.engine.reliability import CheckpointWriteError
    target = tmp_path / 'epoch_3.pth'
    atomic_write(b'old complete checkpoint', str(target))

    def full(fd):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, 'fsync', full)
    with pytest.raises(CheckpointWriteError) as error:
        atomic_write(b'x' * 3 * 2 ** 20, str(target))
    message = str(error.value)
    assert f'could not write {target} (3.0 MiB): {cause}' in message and 'GiB free on' in message
    assert target.read_bytes() == b'old complete checkpoint' and os.listdir(tmp_path) == ['epoch_3.pth']


def _write_checkpoints(work_dir, steps):
    for step in steps:
        torch.save({'meta': {'iter': step}, 'state_dict': {'w': torch.full((64,), float(step))}},
                   str(work_dir / f'iter_{step}.pth'))


def test_auto_resume_skips_incomplete_checkpoints(tmp_path):
    _write_checkpoints(tmp_path, (2, 4, 6))
    # iter_6: cut short by a kill during an in-place write (mmengine's own writer); iter_4: empty
    data = (tmp_path / 'iter_6.pth').read_bytes()
    (tmp_path / 'iter_6.pth').write_bytes(data[:len(data) // 2])
    (tmp_path / 'iter_4.pth').write_bytes(b'')
    (tmp_path / 'last_checkpoint').write_text(str(tmp_path / 'iter_6.pth'))
    (tmp_path / '.iter_8.pth.abc.partial').write_bytes(data)
    found, skipped = find_resumable_checkpoint(str(tmp_path))
    assert found == str(tmp_path / 'iter_2.pth')
    assert [osp.basename(p) for p, _ in skipped] == ['iter_6.pth', 'iter_4.pth']
    assert 'incomplete' in skipped[0][1] and 'empty' in skipped[1][1]
    cfg = resolve_auto_resume(Config(dict(work_dir=str(tmp_path))))
    assert cfg.resume is True and cfg.load_from == str(tmp_path / 'iter_2.pth')
    # nothing usable left: start afresh instead of letting mmengine load what last_checkpoint names
    os.remove(tmp_path / 'iter_2.pth')
    cfg = resolve_auto_resume(Config(dict(work_dir=str(tmp_path))))
    assert cfg.resume is False and cfg.load_from is None


def test_explicit_resume_from_a_truncated_checkpoint_is_refused(tiny_det_config, tmp_path):
    _write_checkpoints(tmp_path, (4,))
    path = tmp_path / 'iter_4.pth'
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(CorruptCheckpointError, match='incomplete or corrupt.*--resume'):
        entrypoints.prepare_train([tiny_det_config, '--demo', '--work-dir', str(tmp_path), '--resume', str(path)])


def test_train_tool_uses_atomic_checkpoints(tiny_det_config, tmp_path):
    cfg = entrypoints.prepare_train([tiny_det_config, '--demo', '--work-dir', str(tmp_path)])
    assert cfg.default_hooks.checkpoint.type == 'AtomicCheckpointHook'
    types = [h['type'] for h in cfg.custom_hooks]
    assert {'NonFiniteGuardHook', 'ExactResumeHook', 'ChannelCheckHook'} <= set(types)


RESUME_OPTIONS = ['train_cfg.max_iters=6', 'default_hooks.checkpoint.interval=2',
                  'default_hooks.checkpoint.max_keep_ckpts=1', *DETERMINISTIC, *NO_VAL]
FAULT = ['default_hooks.fault.type=FaultInjectionHook']


@pytest.mark.slow
def test_killed_runs_resume_bitwise_exactly(tiny_configs, tmp_path):
    """Reference: 6 uninterrupted iterations. Then a run killed while writing the checkpoint of iteration 4:
    iteration 2's must survive (although max_keep_ckpts=1), and resuming from it must end with the reference's
    weights and optimizer state, bit for bit."""
    config = tiny_configs['mask_rcnn']
    _run(config, tmp_path / 'reference', RESUME_OPTIONS)
    work = tmp_path / 'killed'
    _run(config, work, RESUME_OPTIONS + FAULT + ['default_hooks.fault.at_iter=4',
                                                 'default_hooks.fault.point=checkpoint_write'], expect_kill=True)
    names = sorted(os.listdir(work))
    assert 'iter_2.pth' in names and 'iter_4.pth' not in names, names
    assert any(n.endswith('.partial') for n in names), names  # the write really was under way
    assert len(_ckpt(work / 'iter_2.pth')['rng_states']) == 1

    log = _run(config, work, RESUME_OPTIONS, extra=['--resume', 'auto'])
    assert f'--resume: resuming from {work / "iter_2.pth"}' in log
    assert not any(n.endswith('.partial') for n in os.listdir(work))
    _assert_bitwise_equal(_ckpt(tmp_path / 'reference' / 'iter_6.pth'), _ckpt(work / 'iter_6.pth'))


@pytest.mark.slow
def test_killed_distributed_run_resumes_bitwise_exactly(tiny_configs, tmp_path):
    """The same for two processes over gloo, killed between iterations: rank 0 dies before iteration 5 (torchrun
    then stops rank 1); the resume starts from iteration 4's checkpoint."""
    config = tiny_configs['mask_rcnn']
    _run(config, tmp_path / 'reference', RESUME_OPTIONS, procs=2)
    work = tmp_path / 'killed'
    _run(config, work, RESUME_OPTIONS + FAULT + ['default_hooks.fault.at_iter=5', 'default_hooks.fault.rank=0'],
         procs=2, expect_kill=True)
    assert len(_ckpt(work / 'iter_4.pth')['rng_states']) == 2  # one per rank
    _run(config, work, RESUME_OPTIONS, procs=2, extra=['--resume'])
    _assert_bitwise_equal(_ckpt(tmp_path / 'reference' / 'iter_6.pth'), _ckpt(work / 'iter_6.pth'))


# An epoch-based run of the tiny Mask R-CNN on the demo data (its real train pipeline, the aspect-ratio batch
# sampler, a persistent dataloader worker), whose workers write every image they load to $LOAD_LOG.
RECORD_LOADS = """import os

from mmcv.transforms import BaseTransform
from mmengine.registry import TRANSFORMS


@TRANSFORMS.register_module()
class RecordLoads(BaseTransform):
    def transform(self, results):
        with open(os.environ['LOAD_LOG'], 'a') as f:
            f.write(f"{os.environ.get('RANK', '0')} {os.path.basename(results['img_path'])}\\n")
        return results
"""


@pytest.fixture(scope='module')
def epoch_based_config(tiny_configs, tmp_path_factory):
    from mmvisatt.engine.demo import to_demo_config
    root = tmp_path_factory.mktemp('epoch_based')
    (root / 'record_loads.py').write_text(RECORD_LOADS)
    cfg = to_demo_config(Config.fromfile(tiny_configs['mask_rcnn']), train=False)
    cfg.custom_imports.imports.append('record_loads')
    cfg.train_dataloader.dataset.pipeline.insert(1, dict(type='RecordLoads'))
    cfg.train_cfg = dict(type='ResumableEpochBasedTrainLoop', max_epochs=2, val_interval=1)
    # the lr decays at the start of the second epoch, so the resumed schedulers are checked too
    cfg.param_scheduler = [dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=3),
                           dict(type='MultiStepLR', by_epoch=True, begin=0, end=2, milestones=[1], gamma=0.1)]
    cfg.default_hooks.checkpoint = dict(type='AtomicCheckpointHook', interval=1, mid_epoch_interval=2,
                                        mid_epoch_max_keep=2)
    cfg.randomness = dict(seed=0, deterministic=True)
    for key in ('val_dataloader', 'val_cfg', 'val_evaluator'):
        cfg[key] = None
    path = str(root / 'tiny_mask_rcnn_epochs.py')
    cfg.dump(path)
    return path, str(root)


def _epoch_run(config, work_dir, options, log, **kwargs):
    path, root = config
    env = dict(LOAD_LOG=str(log), PYTHONPATH=os.pathsep.join([root, os.environ.get('PYTHONPATH', '')]))
    return _run(path, work_dir, options, demo=False, env=env, **kwargs)


def _loads(log, rank: int = 0):
    with open(log) as f:
        return [name for r, name in (line.split() for line in f) if int(r) == rank]


@pytest.mark.slow
def test_killed_epoch_based_run_resumes_inside_the_epoch_bitwise_exactly(epoch_based_config, tmp_path):
    """2 epochs of 5 batches, checkpoints every 2 iterations inside epochs: killed before iteration 9, resumed
    from iter_8.pth (3 batches into epoch 2), the run ends with the reference's weights, bit for bit, having loaded
    only the images of epoch 2's last two batches. A resume with another batch size is refused."""
    options = ['train_dataloader.dataset.indices=10']
    _epoch_run(epoch_based_config, tmp_path / 'reference', options, tmp_path / 'reference.loads')
    reference = _loads(tmp_path / 'reference.loads')
    assert len(reference) == 20
    work = tmp_path / 'killed'
    _epoch_run(epoch_based_config, work, options + FAULT + ['default_hooks.fault.at_iter=9'],
               tmp_path / 'killed.loads', expect_kill=True)
    names = set(os.listdir(work))
    # the newest two mid-epoch checkpoints (iteration 10 ends epoch 2, so it is an epoch checkpoint)
    assert {'epoch_1.pth', 'iter_6.pth', 'iter_8.pth'} <= names and not {'iter_2.pth', 'iter_4.pth'} & names
    assert _ckpt(work / 'iter_8.pth')['meta']['epoch'] == 1

    log = _epoch_run(epoch_based_config, work, options, tmp_path / 'resumed.loads', extra=['--resume'])
    assert f'--resume: resuming from {work / "iter_8.pth"}' in log
    assert _loads(tmp_path / 'resumed.loads') == reference[16:]
    _assert_bitwise_equal(_ckpt(tmp_path / 'reference' / 'epoch_2.pth'), _ckpt(work / 'epoch_2.pth'))
    assert _ckpt(work / 'epoch_2.pth')['meta']['epoch'] == 2

    log = _epoch_run(epoch_based_config, work, options + ['train_dataloader.batch_size=1'], tmp_path / 'x.loads',
                     extra=['--resume', str(work / 'iter_8.pth')], expect_kill=True)
    assert 'error: --resume: the checkpoint was written inside epoch 2, after 3 of its 5 batches, by 1 ' \
           'process(es) with 2 images each; this run has 1 x 1' in log
    assert 'Traceback' not in log


@pytest.mark.slow
def test_killed_distributed_epoch_based_run_resumes_inside_the_epoch_bitwise_exactly(epoch_based_config, tmp_path):
    """The same with two processes over gloo: 2 epochs of 3 batches per process; rank 0 dies before iteration 5,
    the resume starts from iter_4.pth (one batch into epoch 2; newer than epoch_1.pth, written at iteration 3)
    and each rank loads only its last two batches."""
    options = ['train_dataloader.dataset.indices=12']
    _epoch_run(epoch_based_config, tmp_path / 'reference', options, tmp_path / 'reference.loads', procs=2)
    work = tmp_path / 'killed'
    kill = FAULT + ['default_hooks.fault.at_iter=5', 'default_hooks.fault.rank=0']
    _epoch_run(epoch_based_config, work, options + kill, tmp_path / 'killed.loads', procs=2, expect_kill=True)
    assert len(_ckpt(work / 'iter_4.pth')['rng_states']) == 2
    _epoch_run(epoch_based_config, work, options, tmp_path / 'resumed.loads', procs=2, extra=['--resume'])
    for rank in (0, 1):
        reference = _loads(tmp_path / 'reference.loads', rank)
        assert len(reference) == 12
        assert _loads(tmp_path / 'resumed.loads', rank) == reference[8:]
    _assert_bitwise_equal(_ckpt(tmp_path / 'reference' / 'epoch_2.pth'), _ckpt(work / 'epoch_2.pth'))


# ---------------------------------------------------------------------------------------------------------------
# 2. Distributed equivalence: 2 processes x batch 1 == 1 process x batch 2
# ---------------------------------------------------------------------------------------------------------------

# no random flips: each process draws augmentation randomness from its own stream (docs/reliability.md)
EQUIVALENCE_OPTIONS = ['train_cfg.max_iters=10', 'default_hooks.trace.type=TrainingTraceHook',
                       'train_dataloader.dataset.pipeline.3.prob=0.0', *DETERMINISTIC, *NO_VAL]


def _traces(work_dir, world: int):
    traces = []
    for rank in range(world):
        with open(osp.join(work_dir, 'trace', f'rank{rank}.json')) as f:
            traces.append(json.load(f))
    return traces


@pytest.mark.slow
@pytest.mark.parametrize('name', ['retinanet', 'semantic_fpn'])
def test_two_processes_batch_1_train_like_one_process_batch_2(tiny_configs, tmp_path, name):
    from mmvisatt.datasets import prepare_demo_ade, prepare_demo_coco
    from mmvisatt.engine import DemoSettings
    config = tiny_configs[name]
    # textured scenes: on the demo's plain-background ones float32 rounding grows over the iterations past the
    # tolerance in both layouts' comparison (docs/reliability.md)
    prepare = prepare_demo_coco if name == 'retinanet' else prepare_demo_ade
    data = prepare(img_size=DemoSettings().img_size, style='textured')
    options = EQUIVALENCE_OPTIONS + [f'train_dataloader.dataset.data_root={data}']
    _run(config, tmp_path / 'one', options + ['train_dataloader.batch_size=2'])
    _run(config, tmp_path / 'two', options + ['train_dataloader.batch_size=1'], procs=2)
    (one,), two = _traces(tmp_path / 'one', 1), _traces(tmp_path / 'two', 2)
    # the same images in every iteration: rank r's i-th image is the r-th of the single process's i-th batch
    assert one['sample_ids'][0::2] == two[0]['sample_ids'] and one['sample_ids'][1::2] == two[1]['sample_ids']
    assert len(one['losses']) == 10
    for it, (single, *ranks) in enumerate(zip(one['losses'], two[0]['losses'], two[1]['losses'])):
        for term, value in single.items():
            mean = sum(r[term] for r in ranks) / len(ranks)
            assert abs(value - mean) < 1e-5, (it + 1, term, value, mean)
    assert two[0]['param_sha256'] == two[1]['param_sha256']


# ---------------------------------------------------------------------------------------------------------------
# 3. Non-finite losses
# ---------------------------------------------------------------------------------------------------------------

@pytest.fixture
def nan_loss_cls_at_iteration_2(monkeypatch):
    """RetinaNet's classification loss is NaN in the second training iteration."""
    from mmdet.models.dense_heads import RetinaHead
    original, calls = RetinaHead.loss_by_feat, []

    def loss_by_feat(self, *args, **kwargs):
        losses = original(self, *args, **kwargs)
        calls.append(1)
        if len(calls) == 2:
            losses['loss_cls'] = [loss * float('nan') for loss in losses['loss_cls']]
        return losses

    monkeypatch.setattr(RetinaHead, 'loss_by_feat', loss_by_feat)


def _train_retinanet(config, work_dir, *options):
    return entrypoints.train_main([config, '--demo', '--work-dir', str(work_dir), '--cfg-options',
                                   'train_cfg.max_iters=3', 'default_hooks.checkpoint.interval=1',
                                   'train_dataloader.num_workers=0', 'train_dataloader.persistent_workers=False',
                                   *NO_VAL, *options])


def test_non_finite_loss_stops_training_naming_iteration_and_term(tiny_configs, tmp_path,
                                                                  nan_loss_cls_at_iteration_2):
    with pytest.raises(NonFiniteLossError) as error:
        _train_retinanet(tiny_configs['retinanet'], tmp_path)
    message = str(error.value)
    assert 'iteration 2' in message and 'loss_cls=nan' in message and 'loss_bbox' not in message
    assert '(images: ' in message and '/train/' in message  # the images of the batch
    assert 'iter_1.pth' in message and 'learning rate' in message
    assert sorted(p for p in os.listdir(tmp_path) if p.endswith('.pth')) == ['iter_1.pth']
    state_dict = _ckpt(tmp_path / 'iter_1.pth')['state_dict']
    assert all(torch.isfinite(v).all() for v in state_dict.values() if v.is_floating_point())


def test_non_finite_loss_can_be_skipped(tiny_configs, tmp_path, nan_loss_cls_at_iteration_2):
    runner = _train_retinanet(tiny_configs['retinanet'], tmp_path,
                              'custom_hooks.0.action=skip')  # custom_hooks.0: the runtime base's guard
    guard = next(h for h in runner.hooks if type(h).__name__ == 'NonFiniteGuardHook')
    assert guard.skipped == [2] and runner.iter == 3
    assert {int(s['step']) for s in runner.optim_wrapper.optimizer.state.values()} == {2}  # 3 iterations, 2 steps
    assert all(torch.isfinite(p).all() for p in runner.model.parameters())


class _GuardedModel(torch.nn.Module):
    """What NonFiniteGuardHook wraps: a model whose ``parse_losses`` sums the loss terms."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(3))

    def parse_losses(self, losses):
        loss = sum(losses.values())
        return loss, dict(loss=loss, **losses)


class _ScalerLikeWrapper:
    """Stands for mmengine's AmpOptimWrapper (which needs a GPU): a ``loss_scaler`` whose step skips an update
    with non-finite gradients, as torch's GradScaler does after reading its inf check back."""
    loss_scaler = object()


def _guarded(action='raise', amp=False):
    from types import SimpleNamespace

    from mmengine.logging import MessageHub
    from mmengine.optim import OptimWrapper

    from mmvisatt.engine.guards import NonFiniteGuardHook
    model = _GuardedModel()
    base = type('AmpLike', (_ScalerLikeWrapper, OptimWrapper), {}) if amp else OptimWrapper
    wrapper = base(torch.optim.SGD(model.parameters(), lr=0.1))
    events = []
    original_backward, original_step = wrapper.backward, wrapper.optimizer.step

    def backward(loss, **kwargs):
        events.append('backward')
        return original_backward(loss, **kwargs)

    def step(*args, **kwargs):
        grads_finite = min(torch.isfinite(p.grad).all().item() for p in model.parameters())  # not __bool__
        events.append('step' if grads_finite or not amp else 'scaler skipped')
        if grads_finite or not amp:
            return original_step(*args, **kwargs)

    wrapper.backward = backward
    wrapper.optimizer.step = step
    runner = SimpleNamespace(optim_wrapper=wrapper, model=model, iter=0, epoch=0,
                             train_loop=SimpleNamespace(max_epochs=1),
                             message_hub=MessageHub.get_instance('guard-test'))
    hook = NonFiniteGuardHook(action=action)
    hook.before_train(runner)
    return hook, model, wrapper, events


def _train_iteration(model, wrapper, value):
    loss, _ = model.parse_losses(dict(loss_a=(model.weight * value).sum()))
    wrapper.update_params(loss)


@pytest.mark.parametrize('amp', [False, True], ids=['fp32', 'amp'])
def test_non_finite_guard_reads_its_verdict_only_at_the_step(amp, monkeypatch):
    """The verdict is read back after the backward is enqueued (fp32: before the optimizer steps; AMP: after the
    scaler's step, which skipped the update itself), never between the forward and the backward."""
    hook, model, wrapper, events = _guarded(amp=amp)
    original_bool = torch.Tensor.__bool__

    def reading(t):
        events.append('read')
        return original_bool(t)

    monkeypatch.setattr(torch.Tensor, '__bool__', reading)
    _train_iteration(model, wrapper, 1.0)
    assert events == (['backward', 'step', 'read'] if amp else ['backward', 'read', 'step'])
    events.clear()
    before = model.weight.detach().clone()
    with pytest.raises(NonFiniteLossError, match='iteration 1: loss_a=nan'):
        _train_iteration(model, wrapper, float('nan'))
    assert events[:2] == ['backward', 'scaler skipped' if amp else 'read']
    assert 'step' not in events and torch.equal(model.weight.detach(), before)


def test_non_finite_guard_skips_under_amp_and_resets_after_a_finite_step():
    hook, model, wrapper, events = _guarded(action='skip', amp=True)
    _train_iteration(model, wrapper, float('inf'))
    assert hook.skipped == [1] and hook._consecutive == 1 and events[-1] == 'scaler skipped'
    _train_iteration(model, wrapper, 1.0)
    assert hook._consecutive == 0 and events[-1] == 'step'


def test_non_finite_guard_covers_every_accumulated_loss():
    """With gradient accumulation the optimizer steps once for several losses: one non-finite among them stops it."""
    from mmengine.optim import OptimWrapper

    from mmvisatt.engine.guards import NonFiniteGuardHook
    hook, model, _, events = _guarded()
    wrapper = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1), accumulative_counts=2)
    runner = hook._runner
    hook.after_train(runner)
    runner.optim_wrapper = wrapper
    hook = NonFiniteGuardHook()
    hook.before_train(runner)
    _train_iteration(model, wrapper, float('nan'))  # accumulated, no step yet
    with pytest.raises(NonFiniteLossError):
        _train_iteration(model, wrapper, 1.0)


# ---------------------------------------------------------------------------------------------------------------
# 4. Bad input
# ---------------------------------------------------------------------------------------------------------------

def test_missing_data_root(tmp_path, monkeypatch):
    from mmvisatt.engine.preflight import MissingDataError
    monkeypatch.chdir(tmp_path)
    with pytest.raises(MissingDataError, match=r'(?s)data/ade/ADEChallengeData2016.*--demo'):
        entrypoints.prepare_train([osp.join(CONFIGS, 'fpn_reswin_t_80k_ade20k.py')])


def _coco(tmp_path, images=1, annotations=((1, 1),), categories=(1, 2)) -> str:
    data = dict(images=[dict(id=i + 1, file_name=f'{i}.jpg', width=32, height=32) for i in range(images)],
                annotations=[dict(id=n + 1, image_id=img, category_id=cat, bbox=[1, 1, 8, 8], area=64, iscrowd=0)
                             for n, (img, cat) in enumerate(annotations)],
                categories=[dict(id=c, name=f'class{c}') for c in categories])
    path = tmp_path / 'instances.json'
    path.write_text(json.dumps(data))
    return str(path)


def test_annotation_problems_are_named(tmp_path):
    check_coco_annotations(_coco(tmp_path))
    with pytest.raises(AnnotationError, match=r'category_id 7 \(2 annotations\).*Add the categories'):
        check_coco_annotations(_coco(tmp_path, annotations=((1, 1), (1, 7), (1, 7))))
    with pytest.raises(AnnotationError, match='lists no images'):
        check_coco_annotations(_coco(tmp_path, images=0, annotations=()))
    with pytest.raises(AnnotationError, match='no annotations'):
        check_coco_annotations(_coco(tmp_path, annotations=()))
    check_coco_annotations(_coco(tmp_path, annotations=()), train=False)  # fine for a test set


def test_annotation_check_runs_before_training(tiny_det_config, tmp_path):
    ann = _coco(tmp_path, annotations=((1, 1), (1, 9)))
    with pytest.raises(AnnotationError, match='category_id 9'):
        entrypoints.train_main([tiny_det_config, '--demo', '--work-dir', str(tmp_path), '--cfg-options',
                                f'train_dataloader.dataset.ann_file={ann}'])


def _demo_image_paths(n: int):
    from mmvisatt.datasets import prepare_demo_coco
    root = prepare_demo_coco(img_size=160)
    return root, sorted(os.listdir(osp.join(root, 'train')))[:n]


def test_grayscale_and_rgba_images_are_converted_to_colour(tmp_path):
    from mmcv.transforms import LoadImageFromFile
    gray = tmp_path / 'gray.png'
    rgba = tmp_path / 'rgba.png'
    cv2.imwrite(str(gray), np.full((40, 50), 128, np.uint8))
    cv2.imwrite(str(rgba), np.dstack([np.full((40, 50, 3), 60, np.uint8), np.full((40, 50), 0, np.uint8)]))
    for path in (gray, rgba):
        img = LoadImageFromFile()(dict(img_path=str(path)))['img']  # what every config's pipeline starts with
        assert img.shape == (40, 50, 3) and img.dtype == np.uint8


def test_corrupt_image_gets_a_clear_error(tiny_configs, tmp_path):
    from mmcv.transforms import LoadImageFromFile
    bad = tmp_path / 'bad.jpg'
    bad.write_bytes(b'\xff\xd8 this is not a jpeg')
    with pytest.raises(AssertionError) as raw:
        LoadImageFromFile()(dict(img_path=str(bad)))
    explained = explain_image_error(raw.value)
    assert isinstance(explained, CorruptImageError) and str(bad) in str(explained) and 'Replace it' in str(explained)
    # end to end: the training images of the demo set, all but their names overwritten with garbage
    root, names = _demo_image_paths(10 ** 6)
    data = tmp_path / 'coco'
    shutil.copytree(osp.join(root, 'annotations'), data / 'annotations')
    (data / 'train').mkdir()
    for name in names:
        (data / 'train' / name).write_bytes(b'garbage')
    with pytest.raises(CorruptImageError, match=r'train/\d+\.\w+ cannot be decoded'):
        entrypoints.train_main([tiny_configs['retinanet'], '--demo', '--work-dir', str(tmp_path / 'work'),
                                '--cfg-options', f'train_dataloader.dataset.data_root={data}',
                                'train_dataloader.num_workers=0', 'train_dataloader.persistent_workers=False',
                                'train_cfg.max_iters=1', *NO_VAL])


def _encode(img: np.ndarray, fmt: str, **pil_options) -> bytes:
    import io

    from PIL import Image
    buffer = io.BytesIO()
    Image.fromarray(img).save(buffer, fmt, **pil_options)
    return buffer.getvalue()


def test_truncated_images_are_refused(tiny_configs, tmp_path):
    from mmvisatt.datasets.transforms import LoadCheckedImageFromFile, image_truncation
    img = np.random.default_rng(0).integers(0, 256, (60, 80, 3), dtype=np.uint8)
    files = {'baseline.jpg': _encode(img, 'JPEG'), 'progressive.jpg': _encode(img, 'JPEG', progressive=True),
             'gray.jpg': _encode(img[..., 0], 'JPEG'), 'image.png': _encode(img, 'PNG')}
    files['padded.jpg'] = files['baseline.jpg'] + b'\0' * 100 + b'appended by a camera'
    load = LoadCheckedImageFromFile()
    for name, data in list(files.items()):
        (tmp_path / name).write_bytes(data)
        loaded = load(dict(img_path=str(tmp_path / name)))  # complete files load, as with mmcv's loader
        assert loaded['img'].shape == (60, 80, 3) and loaded['ori_shape'] == (60, 80)
        assert image_truncation(str(tmp_path / name)) is None
        cut = tmp_path / f'cut_{name}'
        cut.write_bytes(data[:len(data) * 3 // 4])
        with pytest.raises(CorruptImageError, match=rf'{cut} is truncated: .*Replace it'):
            load(dict(img_path=str(cut)))
        assert image_truncation(str(cut)) is not None  # the diagnosis of the train/test/infer commands
    # a decoder that returns the part that is there: nothing but the check would stop this image
    assert cv2.imread(str(tmp_path / 'cut_baseline.jpg')).shape == (60, 80, 3)

    # end to end, through a dataloader worker: the demo training images as JPEGs, cut short (OpenCV 5's imdecode
    # refuses them, earlier builds decode them partially: either way the error says the file is truncated)
    root, names = _demo_image_paths(10 ** 6)
    data = tmp_path / 'coco'
    shutil.copytree(osp.join(root, 'annotations'), data / 'annotations')
    (data / 'train').mkdir()
    for name in names:
        jpeg = _encode(cv2.imread(osp.join(root, 'train', name))[..., ::-1], 'JPEG')
        scan = jpeg.rfind(b'\xff\xda')  # cut half way through the image data; decoders read the content, not the
        (data / 'train' / name).write_bytes(jpeg[:(scan + len(jpeg)) // 2])  # suffix
    with pytest.raises(CorruptImageError) as error:
        entrypoints.train_main([tiny_configs['retinanet'], '--demo', '--work-dir', str(tmp_path / 'work'),
                                '--cfg-options', f'train_dataloader.dataset.data_root={data}',
                                'train_dataloader.num_workers=1', 'train_dataloader.persistent_workers=False',
                                'train_cfg.max_iters=1', *NO_VAL])
    message = str(error.value)
    assert re.match(r'Image \S+/train/\d+\.\w+ is truncated: the JPEG file', message), message
    assert 'Traceback' not in message and 'Replace it' in message


def _tiny_reswin(**kwargs):
    return MODELS.build(dict(type='ReSwinTransformer', arch=dict(embed_dims=16, depths=(1, 1, 1, 1),
                                                                 num_heads=(1, 1, 2, 2)), **kwargs))


def test_too_small_and_wrong_channel_inputs():
    backbone = _tiny_reswin().eval()
    with pytest.raises(ValueError, match=r'expects images of shape \(B, 3, H, W\).*in_channels=1'):
        backbone(torch.zeros(1, 1, 64, 64))
    with pytest.raises(ValueError, match=r'at least 4x4 pixels.*resize or pad'):
        backbone(torch.zeros(1, 3, 2, 2))


@pytest.mark.parametrize('family,arch', [('ReViT', 'b'), ('ReSwinTransformer', 't'), ('ReMViTv2', 't'),
                                         ('FANHybrid', 'fan_hybrid_s'), ('RMT', 't'), ('EVT', 't'),
                                         ('ShuntedTransformer', 't')])
def test_unknown_arch_and_out_indices(family, arch):
    with pytest.raises(ValueError, match=rf"Unknown {family} arch 'xxl'; choose one of \[.*\].*or pass a dict"):
        MODELS.build(dict(type=family, arch='xxl'))
    for wrong in ((4,), (0, -5)):
        with pytest.raises(ValueError, match=r'out_indices \(.*\) out of range for 4 outputs'):
            MODELS.build(dict(type=family, arch=arch, out_indices=wrong))


def test_neck_channels_that_disagree_with_the_backbone(tiny_configs, tmp_path):
    with pytest.raises(ValueError) as error:
        _train_retinanet(tiny_configs['retinanet'], tmp_path, 'model.neck.in_channels=[96,192,384]')
    message = str(error.value)
    assert 'model.neck.in_channels=[96, 192, 384] does not match' in message
    assert 'channels [32, 64, 128]' in message and 'Set model.neck.in_channels=[32, 64, 128]' in message


def test_checkpoint_of_another_family_or_truncated(tmp_path):
    from mmvisatt.checkpoint.loading import CheckpointMismatchError, load_pretrained
    rmt = MODELS.build(dict(type='RMT', arch='t'))
    path = tmp_path / 'rmt.pth'
    torch.save({'state_dict': {f'backbone.{k}': v for k, v in rmt.state_dict().items()}}, str(path))
    with pytest.raises(CheckpointMismatchError, match='not recognised as reswin'):
        load_pretrained(_tiny_reswin(), str(path), family='reswin')
    path.write_bytes(path.read_bytes()[:1000])
    init = dict(type='Pretrained', checkpoint=str(path))
    with pytest.raises(CorruptCheckpointError, match=r'model\.backbone\.init_cfg .*incomplete.*Download it again'):
        preflight.check_model_files(Config(dict(model=dict(backbone=dict(init_cfg=init)))))


def test_misspelled_cfg_options_list_close_matches(tiny_det_config, tmp_path):
    args = [tiny_det_config, '--demo', '--work-dir', str(tmp_path), '--cfg-options']
    with pytest.raises(ConfigKeyError) as error:
        entrypoints.prepare_train(args + ['train_cfg.max_iter=3', 'model.backbon.drop_path_rate=0'])
    message = str(error.value)
    assert 'did you mean train_cfg.max_iters?' in message and 'did you mean model.backbone?' in message
    with pytest.raises(ConfigKeyError, match='has only 5 entries'):  # the checked loader is one step
        entrypoints.prepare_train(args + ['train_dataloader.dataset.pipeline.7.prob=0'])
    # new keys without a near namesake are fine
    cfg = entrypoints.prepare_train(args + ['default_hooks.trace.type=TrainingTraceHook', 'train_cfg.max_iters=3'])
    assert cfg.default_hooks.trace.type == 'TrainingTraceHook' and cfg.train_cfg.max_iters == 3


# ---------------------------------------------------------------------------------------------------------------
# 5. Load: the data pipeline keeps up and does not leak
# ---------------------------------------------------------------------------------------------------------------

def _rss_kib(pid: int) -> int:
    with open(f'/proc/{pid}/status') as f:
        return next(int(line.split()[1]) for line in f if line.startswith('VmRSS:'))


def _tree_rss_kib() -> int:
    pid = os.getpid()
    with open(f'/proc/{pid}/task/{pid}/children') as f:
        children = [int(c) for c in f.read().split()]
    return _rss_kib(pid) + sum(_rss_kib(c) for c in children if osp.exists(f'/proc/{c}'))


@pytest.mark.slow
def test_dataloader_keeps_up_without_leaking(tiny_det_config):
    from mmengine.registry import DefaultScope
    from mmengine.runner import Runner
    from mmdet.utils import register_all_modules
    from mmvisatt.engine import DemoSettings, to_demo_config
    register_all_modules(init_default_scope=False)
    settings = DemoSettings()
    cfg = to_demo_config(Config.fromfile(tiny_det_config), settings)
    loader_cfg = cfg.train_dataloader
    loader_cfg.update(batch_size=4 * settings.batch_size, num_workers=2, persistent_workers=True)
    with DefaultScope.overwrite_default_scope('mmdet'):
        loader = Runner.build_dataloader(loader_cfg, seed=0)
    batches, waits, rss = 0, [], {}
    while batches < 200:
        start = time.perf_counter()
        for batch in loader:
            waits.append(time.perf_counter() - start)
            batches += 1
            assert len(batch['inputs']) == 8
            if batches in (20, 200):  # after warm-up (workers started, caches filled) and at the end
                rss[batches] = _tree_rss_kib()
            if batches == 200:
                break
            start = time.perf_counter()
    growth = rss[200] / rss[20] - 1
    assert growth < 0.05, f'RSS grew {growth:.1%} from batch 20 to 200 ({rss[20]} -> {rss[200]} KiB)'
    # a tiny Mask R-CNN iteration at batch 8 takes seconds on this CPU; the loader must stay far below
    mean_wait = float(np.mean(waits[20:]))
    assert mean_wait < 0.25, f'the model would wait {mean_wait:.3f} s per batch for data'


NOT_CHECKPOINTS = {
    'empty': (b'', 'an empty file'),
    'html': (b'<!DOCTYPE html>\n<html lang="en"><head><title>reswin_t.pth - GitHub</title>', 'a web page'),
    'lfs': (b'version https://git-lfs.github.com/spec/v1\noid sha256:4d7a2b\nsize 113043405\n', 'a git-lfs pointer'),
    'text': (b'404: Not Found', 'a text file'),
    'binary': (bytes(range(200, 256)) * 4, 'neither a torch.save archive nor a pickle'),
}


@pytest.mark.parametrize('kind', list(NOT_CHECKPOINTS))
def test_files_that_are_not_checkpoints_are_named_everywhere(kind, tiny_det_config, tmp_path):
    """init_cfg, load_from, tools/test.py and the converter identify the file before torch.load sees it."""
    from mmvisatt.checkpoint import NotACheckpointError, read_checkpoint
    content, what = NOT_CHECKPOINTS[kind]
    path = tmp_path / 'download.pth'
    path.write_bytes(content)
    with pytest.raises(NotACheckpointError, match=f'{path} is {what}'):
        read_checkpoint(str(path))
    init = dict(type='Pretrained', checkpoint=str(path))
    with pytest.raises(CorruptCheckpointError, match=f'model.backbone.init_cfg {path} is {what}'):
        preflight.check_model_files(Config(dict(model=dict(backbone=dict(init_cfg=init)))))
    with pytest.raises(CorruptCheckpointError, match=f'load_from checkpoint {path} is {what}'):
        preflight.check_model_files(Config(dict(model=dict(), load_from=str(path))))
    with pytest.raises(CorruptCheckpointError, match=f'Checkpoint {path} is {what}'):
        entrypoints.prepare_test([tiny_det_config, str(path), '--demo', '--work-dir', str(tmp_path)])
    sys.path.insert(0, osp.join(REPO, 'tools', 'model_converters'))
    import convert
    with pytest.raises(SystemExit, match=f'convert: Checkpoint {path} is {what}'):
        convert.main([str(path), str(tmp_path / 'out.pth')])


def test_real_checkpoints_are_not_mistaken(tmp_path):
    from mmvisatt.checkpoint import not_a_checkpoint
    torch.save({'w': torch.ones(2)}, tmp_path / 'zip.pth')
    torch.save({'w': torch.ones(2)}, tmp_path / 'legacy.pth', _use_new_zipfile_serialization=False)
    assert not_a_checkpoint(str(tmp_path / 'zip.pth')) is None
    assert not_a_checkpoint(str(tmp_path / 'legacy.pth')) is None


def _user_config(tmp_path, base: str, body: str) -> str:
    path = tmp_path / 'my_config.py'
    path.write_text(f"_base_ = [{osp.join(REPO, 'configs', base)!r}]\n" + body)
    return str(path)


def test_mmdet2_keys_get_their_3x_names(tmp_path):
    config = _user_config(tmp_path, 'retinanet_shunted_s_1x.py',
                          "optimizer = dict(lr=0.005)\ndata = dict(samples_per_gpu=4)\nrunner = dict(max_epochs=24)\n"
                          "resume_from = 'work_dirs/x/epoch_3.pth'\n")
    with pytest.raises(ConfigKeyError) as error:
        entrypoints.prepare_train([config, '--work-dir', str(tmp_path)])
    message = str(error.value)
    for old, new in [('optimizer', 'optim_wrapper.optimizer'), ('data', 'samples_per_gpu -> batch_size'),
                     ('runner', 'train_cfg'), ('resume_from', '--resume PATH')]:
        assert f'{old} (2.x) -> ' in message and new in message
    base = osp.join(REPO, 'configs', 'retinanet_shunted_s_1x.py')
    with pytest.raises(ConfigKeyError, match=r'(?s)--cfg-options: .*lr_config \(2.x\) -> param_scheduler'):
        entrypoints.prepare_train([base, '--demo', '--work-dir', str(tmp_path), '--cfg-options', 'lr_config.step=3'])


def test_keys_a_class_does_not_take_get_its_closest_arguments(tmp_path):
    config = _user_config(tmp_path, 'retinanet_shunted_s_1x.py',
                          "model = dict(backbone=dict(_delete_=True, type='ShuntedTransformer', arch='t', "
                          'drop_path=0.3))\n')
    cfg = entrypoints.prepare_train([config, '--demo', '--work-dir', str(tmp_path)])
    with pytest.raises(ConfigKeyError, match=r"ShuntedTransformer the key 'drop_path'.*did you mean drop_path_rate"):
        entrypoints.build_runner(cfg, entrypoints.import_task_library(cfg))


def test_top_level_typos_get_the_runner_key(tmp_path):
    config = _user_config(tmp_path, 'retinanet_shunted_s_1x.py', "optim_wraper = dict(optimizer=dict(lr=0.01))\n")
    with pytest.raises(ConfigKeyError, match=r"my_config.py sets 'optim_wraper', which the Runner does not read.*"
                                             r"did you mean 'optim_wrapper'"):
        entrypoints.prepare_train([config, '--work-dir', str(tmp_path)])


@pytest.mark.parametrize('registry,cfg,expected', [
    ('LOOPS', dict(type='EpochBasedTrainLoop', runner=None, dataloader=None, max_epoch=3), 'max_epochs'),
    ('HOOKS', dict(type='LoggerHook', intervall=3), 'interval'),
    ('OPTIMIZERS', dict(type='AdamW', params=[torch.zeros(1)], weight_decay=0.1, betas2=0.9), 'betas')])
def test_keys_of_parts_the_runner_builds_get_their_closest_arguments(registry, cfg, expected):
    from mmengine import registry as registries
    with pytest.raises(TypeError) as error:
        getattr(registries, registry).build(cfg)
    explained = preflight.explain_build_error(error.value)
    assert explained is not None and f'did you mean {expected}' in str(explained)


def test_a_process_group_that_never_fills_says_what_it_waits_for(tiny_det_config, tmp_path):
    """WORLD_SIZE=2 with one process started: after init_timeout seconds the process names what it waits for and
    exits (status 3), instead of torch's 30 silent minutes."""
    port = _free_port()
    env = dict(os.environ, WORLD_SIZE='2', RANK='0', LOCAL_RANK='0', MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port),
               OMP_NUM_THREADS='1')
    cmd = [sys.executable, osp.join(REPO, 'tools', 'train.py'), tiny_det_config, '--demo', '--launcher', 'pytorch',
           '--work-dir', str(tmp_path), '--cfg-options', 'env_cfg.dist_cfg.init_timeout=3']
    start = time.time()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert (f'process group not formed after 3 s: rank 0 of WORLD_SIZE=2 is waiting for the other processes at '
            f'127.0.0.1:{port}') in proc.stderr
    assert 'env_cfg.dist_cfg.init_timeout=SECONDS' in proc.stderr and time.time() - start < 240
    # said at once, before the wait
    waiting = proc.stderr.index(f'rank 0 of WORLD_SIZE=2: waiting for all 2 processes at 127.0.0.1:{port} (up to 3 s')
    assert waiting < proc.stderr.index('process group not formed')


def test_a_syntax_error_in_an_inherited_file_names_it(tmp_path):
    from mmvisatt.engine.entrypoints import ConfigFileError
    (tmp_path / 'my_base.py').write_text("_base_ = [{!r}]\nmodel = dict(backbone=dict(\n    drop_path_rate=0.2,\n"
                                         .format(osp.join(REPO, 'configs', 'upernet_rmt_t_160k_ade20k.py')))
    (tmp_path / 'my_config.py').write_text("_base_ = ['./my_base.py']\n")
    with pytest.raises(ConfigFileError, match=rf"{tmp_path / 'my_base.py'}:2:\d+: '\(' was never closed"):
        entrypoints.prepare_train([str(tmp_path / 'my_config.py'), '--work-dir', str(tmp_path)])


# the demo model with two of the demo's three classes: a consistent config that the demo checkpoint does not fit
TWO_CLASSES = ['model.roi_head.bbox_head.num_classes=2', 'model.roi_head.mask_head.num_classes=2'] + [
    f'{split}_dataloader.dataset.metainfo.classes=(square,circle,)' for split in ('train', 'val', 'test')]


def test_test_tool_refuses_a_checkpoint_of_another_model(demo_det_run, tiny_det_config, tmp_path):
    from mmvisatt.checkpoint import CheckpointMismatchError
    args = [tiny_det_config, osp.join(demo_det_run, 'iter_3.pth'), '--demo', '--work-dir', str(tmp_path)]
    with pytest.raises(CheckpointMismatchError) as error:
        entrypoints.test_main(args + ['--cfg-options', *TWO_CLASSES, 'visualizer.name=mismatch_test'])
    message = str(error.value)
    assert 'does not fit the model' in message and 'roi_head.bbox_head.fc_cls.weight' in message
    assert 'trained for' in message


def test_resume_with_another_class_count_is_refused_before_training(demo_det_run, tiny_det_config, tmp_path):
    from mmvisatt.checkpoint import CheckpointMismatchError
    shutil.copy(osp.join(demo_det_run, 'iter_3.pth'), tmp_path / 'iter_3.pth')
    with pytest.raises(CheckpointMismatchError, match=r'(?s)fc_cls.weight.*--resume continues the model'):
        entrypoints.train_main([tiny_det_config, '--demo', '--work-dir', str(tmp_path), '--resume',
                                str(tmp_path / 'iter_3.pth'), '--cfg-options', *TWO_CLASSES,
                                'visualizer.name=resume_mismatch'])


def test_moved_data_with_a_stale_evaluator_file_is_refused(tmp_path):
    from mmvisatt.engine.preflight import check_evaluator_files
    cfg = Config.fromfile(osp.join(REPO, 'configs', 'mask_rcnn_reswin_t_1x.py'))
    check_evaluator_files(cfg)  # the shipped config is consistent
    cfg.merge_from_dict({'val_dataloader.dataset.data_root': 'data/my_set/'})
    with pytest.raises(AnnotationError) as error:
        check_evaluator_files(cfg)
    message = str(error.value)
    assert 'val_evaluator.ann_file is data/coco/annotations/instances_val2017.json' in message
    assert '--cfg-options val_evaluator.ann_file=data/my_set/annotations/instances_val2017.json' in message
    cfg.merge_from_dict({'val_evaluator.ann_file': 'data/my_set/annotations/instances_val2017.json'})
    with pytest.raises(AnnotationError, match='test_evaluator.ann_file is data/coco'):
        cfg.merge_from_dict({'test_dataloader.dataset.data_root': 'data/my_set/'})
        check_evaluator_files(cfg)


def test_load_from_a_backbone_only_file_is_refused(tiny_det_config, tmp_path):
    """An ImageNet backbone file as load_from would match no key of the detector: refused, pointing to init_cfg."""
    from mmvisatt.checkpoint import CheckpointMismatchError
    from mmvisatt.models.backbones import ReSwinTransformer
    backbone = ReSwinTransformer(arch=dict(embed_dims=16, depths=(1, 1, 1, 1), num_heads=(1, 1, 2, 2)))
    official = {k: v for k, v in backbone.state_dict().items() if not k.startswith(('norm0', 'norm1', 'norm2'))}
    path = tmp_path / 'imagenet.pth'
    torch.save({'model': official}, path)
    with pytest.raises(CheckpointMismatchError) as error:
        entrypoints.prepare_train([tiny_det_config, '--demo', '--work-dir', str(tmp_path / 'w'), '--cfg-options',
                                   f'load_from={path}'])
    message = str(error.value)
    assert str(path) in message and 'a reswin backbone alone' in message
    assert f'model.backbone.init_cfg.checkpoint={path}' in message
    # a whole detector's file passes
    torch.save({'state_dict': {'backbone.' + k: v for k, v in backbone.state_dict().items()}}, tmp_path / 'det.pth')
    entrypoints.prepare_train([tiny_det_config, '--demo', '--work-dir', str(tmp_path / 'w'), '--cfg-options',
                               f'load_from={tmp_path / "det.pth"}'])


def test_a_swin_v2_file_is_not_converted_as_reswin(tmp_path):
    state = {'layers.0.blocks.0.attn.qkv.weight': torch.zeros(48, 16), 'layers.0.blocks.0.attn.logit_scale':
             torch.zeros(1, 1, 1), 'layers.0.blocks.0.attn.cpb_mlp.0.weight': torch.zeros(512, 2)}
    torch.save({'model': state}, tmp_path / 'swinv2.pth')
    sys.path.insert(0, osp.join(REPO, 'tools', 'model_converters'))
    import convert
    with pytest.raises(SystemExit) as error:
        convert.main([str(tmp_path / 'swinv2.pth'), str(tmp_path / 'out.pth'), '--family', 'reswin'])
    assert f'{tmp_path / "swinv2.pth"}: a Swin Transformer V2 checkpoint' in str(error.value.code)
    assert not (tmp_path / 'out.pth').exists()


def test_home_relative_checkpoint_paths(tmp_path, monkeypatch):
    """~/... is the user's home for init_cfg, load_from, tools/test.py and the pre-flight's existence check."""
    from mmvisatt.engine.preflight import check_pretrained
    monkeypatch.setenv('HOME', str(tmp_path))
    torch.save({'state_dict': {'w': torch.ones(1)}}, tmp_path / 'weights.pth')
    cfg = Config(dict(model=dict(backbone=dict(init_cfg=dict(type='Pretrained', checkpoint='~/weights.pth')))))
    check_pretrained(cfg)
    preflight.check_model_files(cfg)


def test_resume_from_a_missing_file_is_named(tiny_det_config, tmp_path):
    from mmvisatt.engine.preflight import MissingCheckpointError
    with pytest.raises(MissingCheckpointError, match=r'--resume work_dirs/nothing/epoch_3.pth: no such file'):
        entrypoints.train_main([tiny_det_config, '--demo', '--work-dir', str(tmp_path), '--resume',
                                'work_dirs/nothing/epoch_3.pth'])


def test_imagenet_folders_without_class_folders_are_named(tmp_path):
    from mmvisatt.engine.preflight import MissingDataError, check_data
    cfg = Config.fromfile(osp.join(REPO, 'configs', 'imagenet_reswin_t.py'))
    for split in ('train', 'val'):
        (tmp_path / split).mkdir()
        cfg[f'{split}_dataloader'].dataset.update(data_root=str(tmp_path), data_prefix=split, ann_file='')
    cv2.imwrite(str(tmp_path / 'val' / 'ILSVRC2012_val_00000001.JPEG'), np.zeros((8, 8, 3), np.uint8))
    (tmp_path / 'train' / 'n01440764').mkdir()
    with pytest.raises(MissingDataError) as error:
        check_data(cfg, ('train_dataloader', 'val_dataloader'))
    message = str(error.value)
    assert f'{tmp_path / "val"} holds 1 images but no class sub-folders' in message
    assert 'val_dataloader.dataset.ann_file=' in message and '--demo' not in message
    # a missing ImageNet suggests the classification demo
    cfg.val_dataloader.dataset.data_root = str(tmp_path / 'nowhere')
    with pytest.raises(MissingDataError) as error:
        check_data(cfg, ('val_dataloader', ))
    assert '--demo' in str(error.value)


def test_cityscapes_without_train_ids_names_the_converter(tmp_path):
    from PIL import Image
    from mmvisatt.engine.preflight import check_dataset_contents
    cfg = Config.fromfile(osp.join(REPO, 'configs', 'segformer_fan_hybrid_t_160k_cityscapes.py'))
    (tmp_path / 'leftImg8bit' / 'train' / 'aachen').mkdir(parents=True)
    (tmp_path / 'gtFine' / 'train' / 'aachen').mkdir(parents=True)
    name = 'aachen_000000_000019'
    Image.new('RGB', (32, 16)).save(tmp_path / 'leftImg8bit' / 'train' / 'aachen' / f'{name}_leftImg8bit.png')
    Image.new('L', (32, 16)).save(tmp_path / 'gtFine' / 'train' / 'aachen' / f'{name}_gtFine_labelIds.png')
    cfg.train_dataloader.dataset.update(data_root=str(tmp_path), data_prefix=dict(img_path='leftImg8bit/train',
                                                                                  seg_map_path='gtFine/train'))
    with pytest.raises(AnnotationError, match=r'aachen_000000_000019_gtFine_labelIds.png does: .*'
                                              r'tools/dataset_converters/cityscapes.py'):
        check_dataset_contents(cfg, 'mmseg', ('train_dataloader', ))
