"""The README's demo, end to end: ``python tools/train.py configs/mask_rcnn_reswin_t_3x.py --demo`` trains the real
recipe from scratch on the generated data, evaluates COCO bbox and segm mAP before and after, and saves a
checkpoint; the trained model must be clearly better than the one it started from."""
import glob
import json
import os
import os.path as osp
import subprocess
import time

import pytest

from conftest import CONFIGS, REPO

# An untrained detector scores 0.000-0.001 mAP; the demo reaches about 0.045 bbox / 0.07 segm mAP (README).
# Ten times the untrained score separates learning from noise with room for thread-scheduling nondeterminism.
MARGIN = 0.01


@pytest.mark.slow
def test_demo_trains_evaluates_and_saves(tmp_path, python):
    work_dir = tmp_path / 'demo'
    start = time.monotonic()
    proc = subprocess.run([python, osp.join(REPO, 'tools', 'train.py'), osp.join(CONFIGS, 'mask_rcnn_reswin_t_3x.py'),
                           '--demo', '--work-dir', str(work_dir)],
                          cwd=str(tmp_path), capture_output=True, text=True, timeout=2400,  # 9 min on a quiet machine
                          # every core (conftest gives xdist workers a share): this is the suite's longest test
                          env=dict(os.environ, OMP_NUM_THREADS=str(len(os.sched_getaffinity(0)))))
    minutes = (time.monotonic() - start) / 60
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    with open(work_dir / 'eval_progress.json') as f:
        progress = json.load(f)
    first, last = progress['first'], progress['last']
    print(f'demo: {minutes:.1f} min; bbox mAP {first["metrics"]["coco/bbox_mAP"]:.3f} -> '
          f'{last["metrics"]["coco/bbox_mAP"]:.3f}, segm mAP {first["metrics"]["coco/segm_mAP"]:.3f} -> '
          f'{last["metrics"]["coco/segm_mAP"]:.3f}')
    assert first['iter'] == 0 and last['iter'] > 0
    for metric in ('coco/bbox_mAP', 'coco/segm_mAP'):
        assert last['metrics'][metric] > first['metrics'][metric] + MARGIN, (metric, progress)

    checkpoints = glob.glob(str(work_dir / 'iter_*.pth'))
    assert [osp.basename(c) for c in checkpoints] == [f'iter_{last["iter"]}.pth']
    assert 'Evaluation progress' in proc.stdout + proc.stderr
