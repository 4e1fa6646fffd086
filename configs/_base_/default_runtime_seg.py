# Runtime shared by the semantic segmentation configs (mmseg 1.x conventions).
default_scope = 'mmseg'
# mmvisatt.models registers the backbones only; the runtime also needs mmvisatt.engine (hooks, checkpoint
# loading under torch >= 2.6, CPU SyncBN) and mmvisatt.datasets.transforms (LoadCheckedImageFromFile)
custom_imports = dict(
    imports=['mmvisatt.models', 'mmvisatt.engine', 'mmvisatt.datasets.transforms'],
    allow_failed_imports=False)

default_hooks = dict(
    timer=dict(type='IterTimerHook'),
    logger=dict(type='LoggerHook', interval=50, log_metric_by_epoch=False),
    param_scheduler=dict(type='ParamSchedulerHook'),
    checkpoint=dict(type='CheckpointHook', by_epoch=False, interval=16000),
    sampler_seed=dict(type='DistSamplerSeedHook'),
    visualization=dict(type='SegVisualizationHook'))

env_cfg = dict(
    cudnn_benchmark=True,
    mp_cfg=dict(mp_start_method='fork', opencv_num_threads=0),
    # tools/train.py switches to gloo when there is no GPU
    dist_cfg=dict(backend='nccl'))

vis_backends = [dict(type='LocalVisBackend')]
# TensorBoard as well (`pip install tensorboard`, then `tensorboard --logdir WORK_DIR`): use
#   vis_backends = [dict(type='LocalVisBackend'), dict(type='TensorboardVisBackend')]
# here, or as `visualizer = dict(vis_backends=[...])` in a config inheriting yours. --cfg-options cannot add a
# dict to a list: `visualizer.vis_backends.0.type=TensorboardVisBackend` replaces the local backend, and
# tools/analysis/plot_logs.py then has no scalars.json to read. See docs/getting_started.md.
visualizer = dict(type='SegLocalVisualizer', vis_backends=vis_backends, name='visualizer')
log_processor = dict(by_epoch=False)

# stop at the first NaN/Inf loss, naming the iteration and the loss term (mmvisatt/engine/guards.py); a progress
# bar over every evaluation
custom_hooks = [dict(type='NonFiniteGuardHook', action='raise'), dict(type='EvalProgressBarHook')]

log_level = 'INFO'
load_from = None
resume = False
tta_model = dict(type='SegTTAModel')
