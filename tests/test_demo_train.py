"""The README's demo, ``python tools/train.py configs/mask_rcnn_reswin_t_3x.py --demo``: the real recipe's model
trains from scratch on the generated data, evaluates COCO bbox and segm mAP before and after, writes its pictures and
saves a checkpoint.

The suite runs the command for 40 of its 300 iterations, enough for the losses to fall clearly; the whole run, whose
mAP must reach what the README's table says, takes 10-17 minutes of both cores and is marked ``demo``: skipped unless
asked for with ``pytest -m demo tests/test_demo_train.py`` (conftest.py)."""
import glob
import json
import os
import os.path as osp
import re
import subprocess
import time
from typing import Dict, List

import pytest

from conftest import CONFIGS, REPO

# Of the low end of the README's range: the seeded run repeats on one machine, but two machines of one kind ended
# at 0.049 and 0.075 bbox mAP with the same commit.
SHARE_OF_README = 0.8


def readme_demo_row():
    """(iteration, bbox mAP, segm mAP) of the README demo table's end-of-training row; of a range, its low end."""
    with open(osp.join(REPO, 'README.md')) as f:
        text = f.read()
    value = r'([\d.]+)(?:-[\d.]+)? .*?'
    match = re.search(rf'^\| end of training \(iteration (\d+)\) \| {value}\| {value}\|$', text, re.M)
    assert match, 'README.md has no "| end of training (iteration N) | bbox | segm |" row'
    return int(match.group(1)), float(match.group(2)), float(match.group(3))


def run_demo(tmp_path, python, options: List[str], env: Dict[str, str]) -> subprocess.CompletedProcess:
    proc = subprocess.run([python, osp.join(REPO, 'tools', 'train.py'), osp.join(CONFIGS, 'mask_rcnn_reswin_t_3x.py'),
                           '--demo', '--work-dir', str(tmp_path / 'demo'), *options],
                          cwd=str(tmp_path), capture_output=True, text=True, timeout=2400, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def check_outputs(work_dir, output: str, iters: int) -> dict:
    """What every demo run leaves: the evaluation progress at iteration 0 and at the end (printed and saved), both
    pictures (their paths printed) and the one checkpoint of the last iteration."""
    with open(work_dir / 'eval_progress.json') as f:
        progress = json.load(f)
    assert progress['first']['iter'] == 0 and progress['last']['iter'] == iters
    assert 'Evaluation progress' in output
    for picture in ('demo_predictions.png', 'demo_curves.png'):
        assert osp.isfile(work_dir / picture) and str(work_dir / picture) in output
    checkpoints = glob.glob(str(work_dir / 'iter_*.pth'))
    assert [osp.basename(c) for c in checkpoints] == [f'iter_{iters}.pth']
    return progress


def logged_losses(work_dir) -> List[dict]:
    """The training log's rows (every 10 iterations, each the mean of its 10)."""
    scalars = glob.glob(str(work_dir / '*' / 'vis_data' / 'scalars.json'))
    assert len(scalars) == 1, scalars
    with open(scalars[0]) as f:
        return [row for row in map(json.loads, f) if 'loss' in row]


@pytest.mark.slow
def test_demo_command_trains_the_real_model(tmp_path, python):
    """40 iterations of the README command with its full-size model (the first validation on 4 images): the RPN
    learns within them (0.64 -> 0.07 in the run of 2026-12-02), and the total loss falls (4.97 -> 3.24)."""
    proc = run_demo(tmp_path, python, ['--cfg-options', 'train_cfg.max_iters=40', 'val_dataloader.dataset.indices=4'],
                    env=dict(os.environ))
    work_dir = tmp_path / 'demo'
    check_outputs(work_dir, proc.stdout + proc.stderr, 40)
    rows = logged_losses(work_dir)
    assert [row['iter'] for row in rows] == [10, 20, 30, 40]
    first, last = rows[0], rows[-1]
    assert last['loss'] < 0.85 * first['loss'], rows
    assert last['loss_rpn_cls'] < 0.5 * first['loss_rpn_cls'], rows


@pytest.mark.slow
@pytest.mark.demo
def test_demo_reaches_the_readme_numbers(tmp_path, python):
    start = time.monotonic()
    # every core (conftest gives xdist workers a share): 9 minutes on a quiet machine, up to 24 beside other tests
    proc = run_demo(tmp_path, python, [],
                    env=dict(os.environ, OMP_NUM_THREADS=str(len(os.sched_getaffinity(0)))))
    minutes = (time.monotonic() - start) / 60
    iters, bbox, segm = readme_demo_row()
    progress = check_outputs(tmp_path / 'demo', proc.stdout + proc.stderr, iters)
    first, last = progress['first'], progress['last']
    print(f'demo: {minutes:.1f} min; bbox mAP {first["metrics"]["coco/bbox_mAP"]:.3f} -> '
          f'{last["metrics"]["coco/bbox_mAP"]:.3f}, segm mAP {first["metrics"]["coco/segm_mAP"]:.3f} -> '
          f'{last["metrics"]["coco/segm_mAP"]:.3f}')
    for metric, readme in (('coco/bbox_mAP', bbox), ('coco/segm_mAP', segm)):
        assert first['metrics'][metric] < 0.01, (metric, progress)
        assert last['metrics'][metric] >= SHARE_OF_README * readme, (metric, readme, progress)
