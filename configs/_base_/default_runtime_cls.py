# Runtime shared by the ImageNet classification configs (mmpretrain 1.x conventions).
default_scope = 'mmpretrain'
# mmvisatt.models registers the backbones only; the runtime also needs mmvisatt.engine (hooks, checkpoint
# loading under torch >= 2.6, CPU SyncBN) and mmvisatt.datasets.transforms (LoadCheckedImageFromFile)
custom_imports = dict(
    imports=['mmvisatt.models', 'mmvisatt.engine', 'mmvisatt.datasets.transforms'],
    allow_failed_imports=False)

default_hooks = dict(
    timer=dict(type='IterTimerHook'),
    logger=dict(type='LoggerHook', interval=100),
    param_scheduler=dict(type='ParamSchedulerHook'),
    # every epoch, and inside epochs every 500 iterations (an ImageNet epoch at 1,024 images: about 1,250), the newest
    # two of those kept; written atomically (docs/reliability.md)
    checkpoint=dict(type='AtomicCheckpointHook', interval=1, mid_epoch_interval=500, mid_epoch_max_keep=2),
    sampler_seed=dict(type='DistSamplerSeedHook'),
    visualization=dict(type='VisualizationHook', enable=False))

env_cfg = dict(
    cudnn_benchmark=False,
    mp_cfg=dict(mp_start_method='fork', opencv_num_threads=0),
    dist_cfg=dict(backend='nccl'))

vis_backends = [dict(type='LocalVisBackend')]
# TensorBoard as well (`pip install tensorboard`, then `tensorboard --logdir WORK_DIR`): use
#   vis_backends = [dict(type='LocalVisBackend'), dict(type='TensorboardVisBackend')]
# here, or as `visualizer = dict(vis_backends=[...])` in a config inheriting yours. --cfg-options cannot add a
# dict to a list: `visualizer.vis_backends.0.type=TensorboardVisBackend` replaces the local backend, and
# tools/analysis/plot_logs.py then has no scalars.json to read. See docs/getting_started.md.
visualizer = dict(type='UniversalVisualizer', vis_backends=vis_backends)

# stop at the first NaN/Inf loss, naming the iteration and the loss term (mmvisatt/engine/guards.py); a progress
# bar over every evaluation
custom_hooks = [dict(type='NonFiniteGuardHook', action='raise'), dict(type='EvalProgressBarHook')]

log_level = 'INFO'
load_from = None
resume = False
randomness = dict(seed=None, deterministic=False)
