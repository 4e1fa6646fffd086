"""Checkpoints written by mmengine 0.10.7 load again under torch >= 2.6 (``weights_only=True`` by default), with no
environment variable: resume (auto and explicit), ``load_from`` and tools/test.py."""
import io
import json
import os.path as osp

import pytest
import torch
from mmengine.logging import HistoryBuffer

from mmvisatt.checkpoint import UnsafeCheckpointError, load_checkpoint_file
from mmvisatt.engine import entrypoints
from mmvisatt.engine.entrypoints import train_main

# No validation while training: these tests are about checkpoints, and 50 images per validation would dominate.
NO_VAL = ['val_dataloader=None', 'val_cfg=None', 'val_evaluator=None']


@pytest.fixture(autouse=True)
def no_weights_only_override(monkeypatch):
    monkeypatch.delenv('TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD', raising=False)
    monkeypatch.delenv('TORCH_FORCE_WEIGHTS_ONLY_LOAD', raising=False)


def _train(config: str, work_dir: str, max_iters: int):
    return train_main([config, '--demo', '--work-dir', work_dir, '--cfg-options', f'train_cfg.max_iters={max_iters}',
                       'default_hooks.checkpoint.interval=2', 'default_hooks.checkpoint.max_keep_ckpts=-1',
                       'default_hooks.trace.type=TrainingTraceHook', *NO_VAL])


def _adamw_steps(runner) -> set:
    return {int(s['step']) for s in runner.optim_wrapper.optimizer.state.values()}


def _trace(work_dir: str) -> dict:
    with open(osp.join(work_dir, 'trace', 'rank0.json')) as f:
        return json.load(f)


@pytest.fixture(scope='module')
def trained(tiny_det_config, tmp_path_factory):
    """4 iterations of the demo, checkpoints at iterations 2 and 4."""
    work_dir = str(tmp_path_factory.mktemp('first'))
    runner = _train(tiny_det_config, work_dir, 4)
    assert runner.iter == 4
    return work_dir


def test_checkpoint_loads_with_weights_only(trained):
    ckpt = load_checkpoint_file(osp.join(trained, 'iter_4.pth'))  # torch.load(weights_only=True) + stand-ins
    assert ckpt['meta']['iter'] == 4
    buffers = ckpt['message_hub']['log_scalars']
    assert buffers and all(isinstance(b, HistoryBuffer) for b in buffers.values())
    assert ckpt['meta']['dataset_meta']['classes'] == ('square', 'circle', 'triangle')


def test_weights_only_still_refuses_other_globals(tmp_path):
    class Smuggled:
        def __reduce__(self):
            return getattr, (HistoryBuffer, '__init__')

    buffer = io.BytesIO()
    torch.save({'x': Smuggled()}, buffer)
    buffer.seek(0)
    path = tmp_path / 'smuggled.pth'
    path.write_bytes(buffer.getvalue())
    with pytest.raises(UnsafeCheckpointError, match='only public methods of HistoryBuffer'):
        load_checkpoint_file(str(path))


def test_auto_resume_continues_from_latest(trained, tiny_det_config):
    runner = train_main([tiny_det_config, '--demo', '--work-dir', trained, '--resume', '--cfg-options',
                         'train_cfg.max_iters=6', 'default_hooks.trace.type=TrainingTraceHook', *NO_VAL])
    assert runner.iter == 6
    assert _adamw_steps(runner) == {6}  # optimizer state came back: 4 resumed steps + 2 new ones
    trace = _trace(trained)
    assert trace['iters'] == 6 and len(trace['sample_ids']) == 2 * 2  # only iterations 5 and 6 ran


def test_resume_from_explicit_path(trained, tiny_det_config, tmp_path):
    runner = train_main([tiny_det_config, '--demo', '--work-dir', str(tmp_path), '--resume',
                         osp.join(trained, 'iter_2.pth'), '--cfg-options', 'train_cfg.max_iters=3', *NO_VAL])
    assert runner.iter == 3
    assert _adamw_steps(runner) == {3}


def test_load_from_takes_weights_only(trained, tiny_det_config, tmp_path):
    ckpt = osp.join(trained, 'iter_4.pth')
    runner = train_main([tiny_det_config, '--demo', '--work-dir', str(tmp_path), '--cfg-options',
                         f'load_from={ckpt}', 'train_cfg.max_iters=0', *NO_VAL])
    assert runner.iter == 0  # weights, not the training state
    saved = load_checkpoint_file(ckpt)['state_dict']
    model = runner.model.state_dict()
    assert saved.keys() == model.keys()
    assert all(torch.equal(saved[k], model[k]) for k in saved)


def test_test_tool_evaluates_a_checkpoint(trained, tiny_det_config, tmp_path):
    metrics = entrypoints.test_main([tiny_det_config, osp.join(trained, 'iter_4.pth'), '--demo', '--work-dir',
                                     str(tmp_path), '--cfg-options', 'test_dataloader.dataset.indices=4'])
    assert 'coco/bbox_mAP' in metrics and 'coco/segm_mAP' in metrics
