"""The README's demo, ``make demo``: stage 1 pre-trains ReSwin-T with ``configs/imagenet_reswin_t.py --demo``,
stage 2 runs ``configs/mask_rcnn_reswin_t_3x.py --demo`` from stage 1's checkpoint: the real recipe's model trains on
the generated data, evaluates COCO bbox and segm mAP before and after, writes its pictures and saves a checkpoint.

The suite runs the detection command for 40 of its 300 iterations, enough for the losses to fall clearly (the
stage-1 -> stage-2 load in a short run is tests/test_demo_journey.py); both whole stages, whose accuracy and mAP must
reach what the tables of docs/getting_started.md say, take about 10 minutes of both cores and are marked ``demo``:
skipped unless asked for with ``pytest -m demo tests/test_demo_train.py`` (conftest.py)."""
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
# the demo's measured tables (the README links them)
DEMO_PAGE = osp.join(REPO, 'docs', 'getting_started.md')


def readme_demo_row():
    """(iteration, bbox mAP, segm mAP) of the demo table's end-of-training row; of a range, its low end."""
    with open(DEMO_PAGE) as f:
        text = f.read()
    value = r'([\d.]+)(?:-[\d.]+)? .*?'
    match = re.search(rf'^\| end of training \(iteration (\d+)\) \| {value}\| {value}\|$', text, re.M)
    assert match, 'docs/getting_started.md has no "| end of training (iteration N) | bbox | segm |" row'
    return int(match.group(1)), float(match.group(2)), float(match.group(3))


def readme_pretraining_row():
    """(iteration, top-1 accuracy in %) of the stage-1 table's end-of-training row."""
    with open(DEMO_PAGE) as f:
        text = f.read()
    match = re.search(r'^\| end of pre-training \(iteration (\d+)\) \| ([\d.]+)% \|$', text, re.M)
    assert match, 'docs/getting_started.md has no "| end of pre-training (iteration N) | X% |" row'
    return int(match.group(1)), float(match.group(2))


def run_demo(tmp_path, python, options: List[str], env: Dict[str, str],
             config: str = 'mask_rcnn_reswin_t_3x.py', work_dir: str = 'demo') -> subprocess.CompletedProcess:
    proc = subprocess.run([python, osp.join(REPO, 'tools', 'train.py'), osp.join(CONFIGS, config),
                           '--demo', '--work-dir', str(tmp_path / work_dir), *options],
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
    # every core (conftest gives xdist workers a share): 10 minutes on a quiet machine, more beside other tests
    env = dict(os.environ, OMP_NUM_THREADS=str(len(os.sched_getaffinity(0))))
    pre_iters, top1 = readme_pretraining_row()
    run_demo(tmp_path, python, [], env, config='imagenet_reswin_t.py', work_dir='demo_imagenet')
    with open(tmp_path / 'demo_imagenet' / 'eval_progress.json') as f:
        pretraining = json.load(f)
    assert pretraining['last']['iter'] == pre_iters
    checkpoint = tmp_path / 'demo_imagenet' / f'iter_{pre_iters}.pth'
    proc = run_demo(tmp_path, python, ['--cfg-options', f'model.backbone.init_cfg.checkpoint={checkpoint}'], env)
    minutes = (time.monotonic() - start) / 60
    assert f'Loaded {checkpoint}' in proc.stdout + proc.stderr
    iters, bbox, segm = readme_demo_row()
    progress = check_outputs(tmp_path / 'demo', proc.stdout + proc.stderr, iters)
    first, last = progress['first'], progress['last']
    print(f'demo: {minutes:.1f} min; top-1 {pretraining["first"]["metrics"]["accuracy/top1"]:.1f} -> '
          f'{pretraining["last"]["metrics"]["accuracy/top1"]:.1f}; bbox mAP '
          f'{first["metrics"]["coco/bbox_mAP"]:.3f} -> {last["metrics"]["coco/bbox_mAP"]:.3f}, segm mAP '
          f'{first["metrics"]["coco/segm_mAP"]:.3f} -> {last["metrics"]["coco/segm_mAP"]:.3f}')
    assert pretraining['last']['metrics']['accuracy/top1'] >= SHARE_OF_README * top1, (top1, pretraining)
    for metric, readme in (('coco/bbox_mAP', bbox), ('coco/segm_mAP', segm)):
        assert first['metrics'][metric] < 0.01, (metric, progress)
        assert last['metrics'][metric] >= SHARE_OF_README * readme, (metric, readme, progress)
