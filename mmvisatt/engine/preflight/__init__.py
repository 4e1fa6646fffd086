"""The pre-flight: every check a command makes before its Runner is built, one entry per command.

``tools/train.py`` calls :func:`check_train` and ``tools/test.py`` :func:`check_test` once, after the config is
loaded and the arguments (``--demo``, ``--cfg-options``, ``--resume``, ...) are applied, so that a wrong key, a
missing or inconsistent dataset, or an unusable checkpoint fails in a second with a message that says what to do,
instead of minutes later inside a dataloader worker or a weight initialiser. ``tools/infer.py`` calls
:func:`check_infer`. The checks run in the order a user would fix them:

1. the config's keys (:mod:`.config`): 2.x keys, top-level typos, misspelled ``--cfg-options`` keys;
2. the data (:mod:`.data`): datasets on disk, evaluator files, classes against heads and annotation contents;
3. the checkpoints (:mod:`.checkpoints`): ``Pretrained`` inits, ``--resume``, ``load_from``, read as data;
4. for training, the work dir (:mod:`.work_dir`): no other run is training in it (:func:`claim_work_dir`, held by
   ``train_main`` while the run lasts).

Training also estimates a dense config's per-GPU memory from the measured table (:mod:`.memory`) right after its
keys, and warns where it exceeds the GPU's.

What only the built model can tell (a checkpoint's fit, the neck's input channels) is checked after the build
(:func:`check_checkpoint_fits`, :class:`~mmvisatt.engine.model_checks.ChannelCheckHook`).
"""
import os.path as osp
from typing import Any, Dict, List, Optional

import torch
from mmengine.config import Config

from .checkpoints import (CorruptCheckpointError, MissingCheckpointError, check_checkpoint_file,
                          check_checkpoint_fits, check_load_from_fits, check_model_files, check_pretrained,
                          check_resume_file, fetch_url, is_url, missing_local_file, pretrained_inits,
                          resolve_checkpoint_uris, resolve_uri)
from .config import (LEGACY_KEYS, ConfigKeyError, check_cfg_options, check_compile_memory_paths, check_format_only,
                     check_legacy_keys, check_top_level_keys, explain_build_error)
from .data import (DROPPED_ERROR_FRACTION, DROPPED_WARN_FRACTION, MAX_CHECKED_ANN_BYTES, SAMPLE, AnnotationError,
                   CorruptImageError, MissingDataError,
                   check_coco_annotations, check_data, check_dataset_contents, check_evaluator_files,
                   explain_image_error, head_num_classes, image_dir, image_dirs, leaf_datasets)
from .memory import check_gpu_memory
from .work_dir import WorkDirError, WorkDirInUseError, WorkDirLock, check_work_dir, claim_work_dir


class InferenceError(ValueError):
    """Bad input to inference that the user can fix (the message says how)."""


def check_config_keys(cfg: Config, config_file: str, options: Optional[Dict[str, Any]] = None,
                      unmerged: Optional[Config] = None) -> None:
    """The config's keys: 2.x and misspelled top-level keys of ``config_file``, then the ``options``
    (``--cfg-options``) against ``unmerged``, the config they were merged into (``cfg`` when there were none)."""
    unmerged = cfg if unmerged is None else unmerged
    check_legacy_keys(unmerged, config_file)
    check_top_level_keys(unmerged, config_file)
    if options:
        check_cfg_options(unmerged, options)
        check_legacy_keys(Config({k.split('.', 1)[0]: None for k in options}), '--cfg-options')


def check_train(cfg: Config, scope: str, config_file: str, options: Optional[Dict[str, Any]] = None,
                unmerged: Optional[Config] = None) -> List[str]:
    """Everything ``tools/train.py`` checks before building its Runner (``scope``: the task library, whose dataset
    types give the default classes); returns the warnings that were logged."""
    loaders = ('train_dataloader', 'val_dataloader')
    check_config_keys(cfg, config_file, options, unmerged)
    if cfg.get('work_dir'):
        check_work_dir(cfg.work_dir)
    resolve_checkpoint_uris(cfg)
    memory = check_gpu_memory(cfg, config_file)
    check_format_only(cfg, ('val_evaluator', ))
    check_data(cfg, loaders)
    check_evaluator_files(cfg)
    # the Runner initialises weights before it loads or resumes, so the file is needed in every case
    check_pretrained(cfg)
    check_resume_file(cfg)
    check_model_files(cfg)
    return memory + check_compile_memory_paths(cfg) + check_dataset_contents(cfg, scope, loaders)


def check_test(cfg: Config, scope: str, config_file: str, options: Optional[Dict[str, Any]] = None,
               unmerged: Optional[Config] = None) -> List[str]:
    """Everything ``tools/test.py`` checks before building its Runner: the keys, the checkpoint to evaluate
    (``cfg.load_from``) and the test data; returns the warnings that were logged."""
    check_config_keys(cfg, config_file, options, unmerged)
    check_format_only(cfg, ('test_evaluator', ))
    resolve_checkpoint_uris(cfg)
    checkpoint = cfg.load_from
    if is_url(checkpoint):
        checkpoint = fetch_url(checkpoint, 'checkpoint')
    if missing_local_file(checkpoint):
        raise FileNotFoundError(f'checkpoint not found: {checkpoint}')
    check_checkpoint_file(checkpoint, 'Checkpoint', 'Pass a complete checkpoint file.', zip_only=True)
    check_data(cfg, ('test_dataloader',))
    check_evaluator_files(cfg)
    return check_dataset_contents(cfg, scope, ('test_dataloader',))


def check_infer(checkpoint: str, device: Optional[str]) -> str:
    """What ``tools/infer.py`` checks before it builds the model: the checkpoint file (returned with ``~``
    expanded) and the device."""
    checkpoint = resolve_uri(checkpoint, 'checkpoint')
    if missing_local_file(checkpoint):
        raise FileNotFoundError(f'checkpoint not found: {osp.expanduser(checkpoint)}')
    if '://' not in checkpoint:
        checkpoint = osp.expanduser(checkpoint)
    if device and device.startswith('cuda') and not torch.cuda.is_available():
        raise InferenceError(f'--device {device}: CUDA is not available here; use --device cpu')
    return checkpoint


__all__ = ['check_train', 'check_test', 'check_infer', 'check_config_keys', 'check_checkpoint_fits',
           'InferenceError', 'CorruptImageError', 'ConfigKeyError', 'AnnotationError', 'CorruptCheckpointError',
           'MissingDataError', 'MissingCheckpointError', 'LEGACY_KEYS', 'SAMPLE', 'DROPPED_WARN_FRACTION',
           'DROPPED_ERROR_FRACTION',
           'MAX_CHECKED_ANN_BYTES',
           'check_cfg_options', 'check_legacy_keys', 'check_top_level_keys', 'explain_build_error', 'check_data',
           'check_evaluator_files', 'check_coco_annotations', 'check_dataset_contents', 'head_num_classes',
           'explain_image_error', 'image_dir', 'image_dirs', 'leaf_datasets', 'check_pretrained',
           'check_resume_file', 'check_checkpoint_file', 'check_load_from_fits', 'check_model_files',
           'pretrained_inits', 'missing_local_file', 'fetch_url', 'is_url', 'check_compile_memory_paths',
           'check_format_only', 'resolve_checkpoint_uris', 'resolve_uri',
           'WorkDirError', 'WorkDirInUseError', 'WorkDirLock', 'check_work_dir', 'claim_work_dir']
