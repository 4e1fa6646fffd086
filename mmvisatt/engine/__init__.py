"""Training plumbing: the logic behind ``tools/train.py`` / ``tools/test.py``, the ``--demo`` transform, hooks, and
what makes training reliable (atomic checkpoints, exact resume also inside epochs, a checkpoint on preemption, the
non-finite loss guard, CPU SyncBN; see docs/reliability.md).

Importing this package (every runtime config's ``custom_imports`` does) registers the hooks in mmengine's root
registry and makes :mod:`mmvisatt.checkpoint.safe_load` mmengine's checkpoint loader for local files and
``http(s)://`` URLs (tensors and plain data only), for the whole process.
"""
from mmvisatt.checkpoint import register_mmengine_loader

from .demo import DemoReportHook, DemoSettings, to_demo_config
from .entrypoints import (parse_test_args, parse_train_args, prepare_test, prepare_train, test_main,
                          train_main)
from .guards import NonFiniteGuardHook, NonFiniteLossError
from .mid_epoch import MidEpochResumeError, ResumableBatchSampler, ResumableEpochBasedTrainLoop, SeededSamples
from .model_checks import BackboneLayoutHook, ChannelCheckHook
from .optimizers import LayerDecayOptimWrapperConstructor  # noqa: F401  (registers it in the root registry)
from .progress import EvalProgressBarHook, EvalProgressHook, TrainingTraceHook
from .reliability import (AtomicCheckpointHook, ExactResumeHook, PreemptionHook, TrainingPreempted,
                          find_resumable_checkpoint)
from .sync_bn import CPUSyncBatchNorm

register_mmengine_loader()

__all__ = [
    'DemoSettings', 'to_demo_config', 'parse_train_args', 'parse_test_args', 'prepare_train', 'prepare_test',
    'train_main', 'test_main', 'DemoReportHook', 'EvalProgressBarHook', 'EvalProgressHook', 'TrainingTraceHook',
    'NonFiniteGuardHook', 'NonFiniteLossError',
    'AtomicCheckpointHook', 'ExactResumeHook', 'PreemptionHook', 'TrainingPreempted',
    'find_resumable_checkpoint',
    'CPUSyncBatchNorm', 'ChannelCheckHook', 'BackboneLayoutHook', 'MidEpochResumeError', 'ResumableBatchSampler',
    'ResumableEpochBasedTrainLoop', 'SeededSamples'
]
