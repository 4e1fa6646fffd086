"""tools/dist_train.sh runs real data-parallel training on a CPU machine: two processes over gloo, each on its own
share of the data, ending with identical weights."""
import json
import os
import os.path as osp
import socket
import subprocess

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import DefaultScope

from conftest import REPO
from mmvisatt.engine import to_demo_config

ITERS, BATCH, WORLD = 3, 2, 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def _expected_sample_ids(config: str, rank: int) -> list:
    """What rank ``rank`` must train on: DefaultSampler's shuffle (seed = the demo's seed, epoch 0) dealt out
    round-robin over the ranks, in batches of the demo dataset's images."""
    from mmdet.registry import DATASETS
    from mmdet.utils import register_all_modules
    register_all_modules(init_default_scope=False)
    cfg = to_demo_config(Config.fromfile(config))
    with DefaultScope.overwrite_default_scope('mmdet'):
        dataset = DATASETS.build(cfg.train_dataloader.dataset)
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(cfg.randomness.seed)).tolist()
    mine = order[rank::WORLD][:ITERS * BATCH]
    return [dataset.get_data_info(i)['img_id'] for i in mine]


@pytest.mark.slow
def test_dist_train_two_processes_gloo(tiny_det_config, tmp_path, python):
    work_dir = tmp_path / 'work'
    env = dict(os.environ, PYTHON=python, PORT=str(_free_port()), OMP_NUM_THREADS='1')
    proc = subprocess.run(
        ['bash', osp.join(REPO, 'tools', 'dist_train.sh'), tiny_det_config, str(WORLD), '--demo', '--work-dir',
         str(work_dir), '--cfg-options', f'train_cfg.max_iters={ITERS}', 'default_hooks.trace.type=TrainingTraceHook',
         'val_dataloader=None', 'val_cfg=None', 'val_evaluator=None'],
        cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    used = Config.fromfile(str(work_dir / osp.basename(tiny_det_config)))  # the config the Runner saved
    assert used.launcher == 'pytorch'
    assert used.env_cfg.dist_cfg.backend == ('nccl' if torch.cuda.is_available() else 'gloo')

    traces = []
    for rank in range(WORLD):
        with open(work_dir / 'trace' / f'rank{rank}.json') as f:
            traces.append(json.load(f))
    assert [t['world_size'] for t in traces] == [WORLD] * WORLD
    assert [t['iters'] for t in traces] == [ITERS] * WORLD
    ids = [t['sample_ids'] for t in traces]
    assert all(len(i) == ITERS * BATCH for i in ids)
    assert not set(ids[0]) & set(ids[1]), 'the ranks trained on overlapping data'
    assert ids == [_expected_sample_ids(tiny_det_config, r) for r in range(WORLD)]
    # different data on each rank, yet the same weights at the end: gradients were averaged across processes
    assert traces[0]['param_sha256'] == traces[1]['param_sha256']


def test_slurm_test_launches_test_py_on_every_task(tmp_path):
    """``tools/slurm_test.sh``: one srun of tools/test.py per GPU with the slurm launcher, as slurm_train.sh does
    for training (srun is a stand-in here that prints what it was asked to run)."""
    fake = tmp_path / 'bin'
    fake.mkdir()
    (fake / 'srun').write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    (fake / 'srun').chmod(0o755)
    env = dict(os.environ, PATH=f"{fake}:{os.environ['PATH']}", GPUS='4')
    run = subprocess.run(['bash', os.path.join(REPO, 'tools', 'slurm_test.sh'), 'gpu', 'test-job',
                          'configs/mask_rcnn_reswin_t_3x.py', 'work_dirs/reswin/epoch_36.pth', '--show-dir', 'vis'],
                         env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    args = run.stdout.split('\n')
    assert args[:2] == ['-p', 'gpu'] and '--job-name=test-job' in args and '--ntasks=4' in args
    assert '--gres=gpu:4' in args and '--ntasks-per-node=4' in args
    i = args.index('-u')
    assert args[i + 1].endswith('tools/test.py') and args[i + 2:i + 7] == [
        'configs/mask_rcnn_reswin_t_3x.py', 'work_dirs/reswin/epoch_36.pth', '--launcher=slurm', '--show-dir', 'vis']
