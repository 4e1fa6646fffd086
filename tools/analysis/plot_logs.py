"""Training curves of a work dir: ``python tools/analysis/plot_logs.py WORK_DIR [--keys loss bbox_mAP] [--out PNG]``.

Reads mmengine's ``WORK_DIR/<timestamp>/vis_data/scalars.json`` and plots the training losses against iteration and
the validation metrics against the iteration they were measured at. The logic lives in
:mod:`mmvisatt.analysis.logs`.
"""
from mmvisatt.analysis.logs import run_plot_logs

if __name__ == '__main__':
    run_plot_logs()
