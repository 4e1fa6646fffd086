"""What ``tools/train.py`` and ``tools/test.py`` do; the scripts only call :func:`train_main` / :func:`test_main`.

One pair of scripts serves mmdet, mmseg and mmpretrain configs: the library is chosen by the config's
``default_scope``. Arguments follow mmdet's tools (``--resume`` with an optional path, ``--auto-scale-lr``, ...).
"""
import argparse
import contextlib
import datetime
import importlib
import os
import os.path as osp
import sys
import threading
from typing import Any, Callable, List, Optional, Sequence, Tuple

import cv2
import torch
from mmengine.config import Config, ConfigDict, DictAction
from mmengine.device import get_device
from mmengine.logging import print_log
from mmengine.runner import Runner

from mmvisatt.checkpoint import CheckpointMismatchError, UnsafeCheckpointError, load_checkpoint_file
from mmvisatt.checkpoint.fit import classes_hint, weights_fit_problem
from .checks import (MissingCheckpointError, MissingDataError, check_data, check_pretrained, image_dir,
                     leaf_datasets, pretrained_inits)
from .demo import DemoSettings, describe_demo, to_demo_config
from .guards import NonFiniteLossError
from .input_checks import (AnnotationError, ConfigFileError, ConfigKeyError, CorruptCheckpointError, CorruptImageError,
                           check_cfg_options, check_checkpoint_file, check_evaluator_files, check_legacy_keys,
                           check_load_from_fits, check_top_level_keys, explain_build_error, explain_image_error,
                           load_config_file)
from .mid_epoch import MidEpochResumeError
from .preflight import preflight
from .reliability import CheckpointWriteError, add_custom_hooks, enable_reliable_training, resolve_auto_resume

LAUNCHERS = ('none', 'pytorch', 'slurm', 'mpi')


def _common_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument('--work-dir', help='directory for logs and checkpoints '
                        '(default: ./work_dirs/<config name>, with a _demo suffix for --demo)')
    parser.add_argument('--demo', action='store_true',
                        help='run on small generated data (no dataset or ImageNet checkpoint needed); the model '
                        'and optimizer recipe stay those of the config')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config settings, e.g. train_dataloader.batch_size=4 '
                        'model.backbone.init_cfg.checkpoint=PATH; lists as key="[a,b]"; applied after --demo')
    parser.add_argument('--launcher', choices=LAUNCHERS, default='none', help='job launcher')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0, help=argparse.SUPPRESS)


def parse_train_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='Train a detector or segmentor with an mmvisatt backbone')
    parser.add_argument('config', help='config file')
    parser.add_argument('--amp', action='store_true', help='automatic mixed precision (needs a GPU)')
    parser.add_argument('--auto-scale-lr', action='store_true',
                        help='scale the lr by (GPUs x batch per GPU) / auto_scale_lr.base_batch_size')
    parser.add_argument('--resume', nargs='?', const='auto', metavar='PATH',
                        help='resume from PATH, or (bare --resume, or --resume auto) from the newest complete '
                        'checkpoint in the work dir (incomplete files are skipped)')
    _common_args(parser)
    return _finish(parser.parse_args(argv))


def parse_test_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='Evaluate a checkpoint on the test set of a config')
    parser.add_argument('config', help='config file')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('--out', help='mmdet: dump raw predictions to this .pkl file; '
                        'mmseg: save predicted maps to this directory')
    parser.add_argument('--show-dir', help='save drawn predictions to this directory (inside the work dir)')
    _common_args(parser)
    return _finish(parser.parse_args(argv))


def _finish(args: argparse.Namespace) -> argparse.Namespace:
    # torchrun passes LOCAL_RANK in the environment; torch.distributed.launch passes --local-rank
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    return args


def import_task_library(cfg: Config) -> str:
    """Import and register the OpenMMLab library named by ``cfg.default_scope``, as its own tools do."""
    scope = cfg.get('default_scope')
    if scope not in ('mmdet', 'mmseg', 'mmpretrain'):
        raise ValueError(f"default_scope must be 'mmdet', 'mmseg' or 'mmpretrain', got {scope!r}")
    utils = importlib.import_module(f'{scope}.utils')
    utils.register_all_modules(init_default_scope=False)
    if hasattr(utils, 'setup_cache_size_limit_of_dynamo'):
        utils.setup_cache_size_limit_of_dynamo()
    return scope


def load_config(args: argparse.Namespace, train: bool) -> Config:
    """The config with ``--demo``, ``--cfg-options`` (after the demo, so they can adjust it), ``--work-dir`` and
    ``--launcher`` applied."""
    cfg = load_config_file(args.config)
    check_legacy_keys(cfg, args.config)
    check_top_level_keys(cfg, args.config)
    config_lr = cfg.get('optim_wrapper', {}).get('optimizer', {}).get('lr')
    if args.demo:
        to_demo_config(cfg, DemoSettings(), train=train)
    if args.cfg_options:
        check_cfg_options(cfg, args.cfg_options)
        cfg.merge_from_dict(args.cfg_options)
        check_legacy_keys(cfg, '--cfg-options')
    if args.demo and train:
        print_log(describe_demo(cfg, config_lr), logger='current')
    cfg.launcher = args.launcher
    if args.work_dir:
        cfg.work_dir = args.work_dir
    elif cfg.get('work_dir') is None:
        name = osp.splitext(osp.basename(args.config))[0]
        cfg.work_dir = osp.join('./work_dirs', name + ('_demo' if args.demo else ''))
    return cfg


def resolve_amp(cfg: Config) -> None:
    """Make the config's mixed precision runnable here.

    An fp16 recipe (``AmpOptimWrapper``, as the official runs) trains in float32 where there is no accelerator,
    with one log line: mmengine's AmpOptimWrapper refuses to start on a CPU. A config turned to ``OptimWrapper``
    (``--cfg-options optim_wrapper.type=OptimWrapper``, AMP off) drops the AMP-only ``loss_scale`` it inherited.
    """
    wrapper = cfg.get('optim_wrapper') or {}
    if wrapper.get('type') == 'AmpOptimWrapper' and get_device() == 'cpu':
        scale = wrapper.get('loss_scale', 'dynamic')
        wrapper.type = 'OptimWrapper'
        print_log(f'No GPU: training in float32 (the config\'s recipe uses fp16 AMP with loss scale {scale}, which '
                  'mmengine\'s AmpOptimWrapper runs on CUDA only)', logger='current')
    if wrapper.get('type') == 'OptimWrapper':
        for key in ('loss_scale', 'dtype'):
            wrapper.pop(key, None)


def apply_train_args(cfg: Config, args: argparse.Namespace) -> Config:
    """``--amp``, ``--auto-scale-lr`` and ``--resume``, with mmdet's semantics; an fp16 recipe falls back to float32
    on a CPU (:func:`resolve_amp`)."""
    if args.amp:
        if get_device() == 'cpu':
            raise RuntimeError('--amp needs a GPU (mmengine\'s AmpOptimWrapper does not run on CPU)')
        cfg.optim_wrapper.type = 'AmpOptimWrapper'
        cfg.optim_wrapper.setdefault('loss_scale', 'dynamic')
    resolve_amp(cfg)
    if args.auto_scale_lr:
        scale_cfg = cfg.get('auto_scale_lr') or {}
        if 'enable' not in scale_cfg or 'base_batch_size' not in scale_cfg:
            raise RuntimeError('--auto-scale-lr needs auto_scale_lr=dict(enable=..., base_batch_size=...) '
                               'in the config')
        cfg.auto_scale_lr.enable = True
    if args.resume == 'auto':
        resolve_auto_resume(cfg)
    elif args.resume is not None:
        cfg.resume, cfg.load_from = True, args.resume
    return cfg


def check_resume_file(cfg: Config) -> None:
    """``--resume PATH`` names a file that exists (mmengine would fail in torch.load with its traceback)."""
    path = cfg.get('load_from')
    if cfg.get('resume') and path and '://' not in path and not osp.isfile(osp.expanduser(path)):
        raise MissingCheckpointError(
            f'--resume {path}: no such file (working directory: {os.getcwd()}). Pass the path of a checkpoint the '
            f'run wrote (work_dir/epoch_N.pth or iter_N.pth), or a bare --resume to continue from the newest '
            f'complete one in the work dir.')


def _replace_sync_bn(node: Any) -> int:
    count = 0
    if isinstance(node, dict):
        if node.get('type') in ('SyncBN', 'MMSyncBN'):
            node['type'] = 'CPUSyncBN'
            count += 1
        count += sum(_replace_sync_bn(v) for v in node.values())
    elif isinstance(node, list):
        count += sum(_replace_sync_bn(v) for v in node)
    return count


# How long a process waits for the others to join its process group before it says what it waits for and exits
# (env_cfg.dist_cfg.init_timeout); torch's own default is 30 minutes of silence.
INIT_TIMEOUT_S = 300.


def _timeout_kwargs(dist_cfg: ConfigDict) -> dict:
    timeout = dist_cfg.get('timeout')
    return {} if timeout is None else {'timeout': datetime.timedelta(seconds=timeout)}


@contextlib.contextmanager
def _forming_group(timeout_s: float):
    """Exit the process with a message naming what it waits for if the process group has not formed within
    ``timeout_s`` seconds (a world size that never fills: fewer processes started than WORLD_SIZE, another
    MASTER_PORT, a node that never came up)."""
    done = threading.Event()
    env = {k: os.environ.get(k, '?') for k in ('RANK', 'WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT')}

    def watch() -> None:
        if done.wait(timeout_s):
            return
        print(f"error: process group not formed after {timeout_s:.0f} s: rank {env['RANK']} of WORLD_SIZE="
              f"{env['WORLD_SIZE']} is waiting for the other processes at {env['MASTER_ADDR']}:"
              f"{env['MASTER_PORT']}. Start all {env['WORLD_SIZE']} (nproc_per_node x nnodes, the same "
              'MASTER_ADDR and MASTER_PORT everywhere), or wait longer with --cfg-options '
              'env_cfg.dist_cfg.init_timeout=SECONDS.', file=sys.stderr, flush=True)
        os._exit(3)

    print(f"rank {env['RANK']} of WORLD_SIZE={env['WORLD_SIZE']}: waiting for all {env['WORLD_SIZE']} processes at "
          f"{env['MASTER_ADDR']}:{env['MASTER_PORT']} (up to {timeout_s:.0f} s, env_cfg.dist_cfg.init_timeout)",
          file=sys.stderr, flush=True)
    threading.Thread(target=watch, daemon=True, name='process-group-watchdog').start()
    try:
        yield
    finally:
        done.set()


def setup_distributed(cfg: Config) -> None:
    """Pick the process-group backend (nccl with CUDA, gloo without) and, for ``--launcher pytorch``, form the
    process group under a watchdog (:func:`_forming_group`, ``env_cfg.dist_cfg.init_timeout`` seconds).

    On a machine without an accelerator, mmengine 0.10.7 cannot start a ``pytorch``-launched job by itself: its
    ``init_dist`` calls ``torch.cuda.set_device`` and its DDP wrapper passes ``device_ids=[LOCAL_RANK]``. So for
    CPU the process group is created here (mmengine then skips its own initialisation), DDP gets
    ``device_ids=None``, and SyncBN, which has no CPU kernel, becomes :class:`~.sync_bn.CPUSyncBatchNorm` (the same
    statistics over all processes, through gloo).
    """
    env_cfg = cfg.setdefault('env_cfg', ConfigDict())
    dist_cfg = env_cfg.setdefault('dist_cfg', ConfigDict())
    init_timeout = float(dist_cfg.pop('init_timeout', INIT_TIMEOUT_S))
    if torch.cuda.is_available():
        dist_cfg.setdefault('backend', 'nccl')
        if cfg.launcher == 'pytorch' and not torch.distributed.is_initialized():
            # what mmengine's init_dist does for this launcher, inside the watchdog
            torch.cuda.set_device(int(os.environ.get('LOCAL_RANK', 0)))
            with _forming_group(init_timeout):
                torch.distributed.init_process_group(backend=dist_cfg.backend, **_timeout_kwargs(dist_cfg))
        return
    if dist_cfg.get('backend', 'nccl') == 'nccl':
        dist_cfg.backend = 'gloo'
    if cfg.launcher == 'none' or get_device() != 'cpu':
        return
    if cfg.launcher != 'pytorch':
        raise RuntimeError(f'CPU distributed runs are supported with --launcher pytorch (tools/dist_train.sh), '
                           f'not {cfg.launcher!r}')
    if not torch.distributed.is_initialized():
        with _forming_group(init_timeout):
            torch.distributed.init_process_group(backend=dist_cfg.backend, **_timeout_kwargs(dist_cfg))
    wrapper = cfg.setdefault('model_wrapper_cfg', ConfigDict(type='MMDistributedDataParallel'))
    wrapper.setdefault('device_ids', None)
    wrapper.setdefault('broadcast_buffers', False)
    wrapper.setdefault('find_unused_parameters', cfg.get('find_unused_parameters', False))
    if _replace_sync_bn(cfg.model):
        print_log('SyncBN has no CPU implementation: using CPUSyncBN (statistics all-reduced over gloo)',
                  logger='current')


def build_runner(cfg: Config, scope: str) -> Runner:
    try:
        if 'runner_type' in cfg:
            return importlib.import_module(f'{scope}.registry').RUNNERS.build(cfg)
        return Runner.from_cfg(cfg)
    except TypeError as error:
        explained = explain_build_error(error)
        if explained is None:
            raise
        raise explained from error


def prepare_train(argv: Optional[Sequence[str]] = None) -> Config:
    """Parse ``argv`` and return the ready-to-run training config (all pre-flight checks passed)."""
    args = parse_train_args(argv)
    cfg = enable_reliable_training(apply_train_args(load_config(args, train=True), args))
    check_data(cfg, ('train_dataloader', 'val_dataloader'))
    check_evaluator_files(cfg)
    # the Runner initialises weights before it loads or resumes, so the file is needed in every case
    check_pretrained(cfg)
    check_model_files(cfg)
    return cfg


def check_model_files(cfg: Config) -> None:
    """Refuse truncated ``Pretrained`` / ``load_from`` / ``--resume PATH`` checkpoints before the Runner starts."""
    for where, init in pretrained_inits(cfg.get('model')):
        check_checkpoint_file(init.get('checkpoint'), f'The checkpoint of {where}',
                              f'Download it again, or pass another one with --cfg-options {where}.checkpoint=PATH.',
                              zip_only=True)
    what = '--resume checkpoint' if cfg.get('resume') else 'load_from checkpoint'
    checkpoint = check_checkpoint_file(cfg.get('load_from'), f'The {what}',
                                       'It was probably written by a job that was killed or ran out of disk; pick an '
                                       'earlier checkpoint, or use --resume (auto), which skips incomplete files.')
    if not cfg.get('resume'):
        check_load_from_fits(cfg.get('model'), cfg.get('load_from'), checkpoint)


def _image_dirs(cfg: Config) -> List[str]:
    loaders = ('train_dataloader', 'val_dataloader', 'test_dataloader')
    dirs = {image_dir(d) for loader in loaders for d in leaf_datasets((cfg.get(loader) or {}).get('dataset'))}
    return sorted(d for d in dirs if d)


@contextlib.contextmanager
def _run_errors_explained(cfg: Config):
    """An image that cannot be decoded, is empty or is truncated ends the run with a :class:`CorruptImageError`
    naming the file (or where to look) and the fix, not mmcv's bare assertion, OpenCV's error or a dataloader
    worker's traceback; a config key that a part built when the run starts (loop, optimizer) does not take, with a
    :class:`ConfigKeyError`."""
    try:
        yield
    except (AssertionError, CorruptImageError, TypeError, RuntimeError, cv2.error) as error:
        if isinstance(error, TypeError):
            explained = explain_build_error(error)
        else:
            explained = explain_image_error(error, _image_dirs(cfg))
        if explained is None:
            raise
        raise explained from error


def train_main(argv: Optional[Sequence[str]] = None) -> Runner:
    cfg = prepare_train(argv)
    check_resume_file(cfg)
    scope = import_task_library(cfg)
    preflight(cfg, scope, ('train_dataloader', 'val_dataloader'))
    setup_distributed(cfg)
    runner = build_runner(cfg, scope)
    if cfg.get('resume') and cfg.get('load_from'):
        check_checkpoint_fits(runner.model, cfg.load_from,
                              hint='--resume continues the model the checkpoint was saved from; to train another '
                              'head or class count from its weights, pass --cfg-options load_from=PATH instead.')
    with _run_errors_explained(cfg):
        runner.train()
    return runner


def prepare_test(argv: Optional[Sequence[str]] = None) -> Tuple[Config, argparse.Namespace]:
    """Parse ``argv`` and return the ready-to-run test config (all pre-flight checks passed) and the arguments."""
    args = parse_test_args(argv)
    cfg = load_config(args, train=False)
    if '://' not in args.checkpoint and not osp.isfile(osp.expanduser(args.checkpoint)):
        raise FileNotFoundError(f'checkpoint not found: {args.checkpoint}')
    cfg.load_from = args.checkpoint
    check_checkpoint_file(args.checkpoint, 'Checkpoint', 'Pass a complete checkpoint file.', zip_only=True)
    check_data(cfg, ('test_dataloader',))
    check_evaluator_files(cfg)
    add_custom_hooks(cfg, 'ChannelCheckHook')
    scope = cfg.get('default_scope')
    if args.show_dir:
        cfg.default_hooks.visualization.draw = True
        if scope == 'mmdet':
            cfg.default_hooks.visualization.test_out_dir = args.show_dir
        else:
            cfg.visualizer.save_dir = args.show_dir
    if args.out and scope == 'mmseg':
        cfg.test_evaluator.update(output_dir=args.out, keep_results=True)
    return cfg, args


def check_checkpoint_fits(model: torch.nn.Module, path: str, demo: bool = False, hint: str = '') -> None:
    """Raise :class:`CheckpointMismatchError` unless the local checkpoint has a tensor of the model's shape for
    every model key: mmengine loads test checkpoints with ``strict=False`` and evaluates whatever results."""
    if '://' in path:
        return
    from mmengine.model import is_model_wrapper
    model = model.module if is_model_wrapper(model) else model
    checkpoint = load_checkpoint_file(path, 'cpu', mmap=True)
    problem = weights_fit_problem(model, checkpoint, hint or classes_hint(checkpoint, demo))
    if problem:
        raise CheckpointMismatchError(f'{path}: {problem}')


def test_main(argv: Optional[Sequence[str]] = None) -> dict:
    cfg, args = prepare_test(argv)
    scope = import_task_library(cfg)
    preflight(cfg, scope, ('test_dataloader',))
    setup_distributed(cfg)
    runner = build_runner(cfg, scope)
    check_checkpoint_fits(runner.model, args.checkpoint, args.demo)
    if args.out and scope == 'mmdet':
        from mmdet.evaluation import DumpDetResults
        runner.test_evaluator.metrics.append(DumpDetResults(out_file_path=args.out))
    with _run_errors_explained(cfg):
        return runner.test()


def run_tool(main: Callable[[Optional[Sequence[str]]], Any], argv: Optional[Sequence[str]] = None) -> None:
    """Run ``main`` as a command: bad input (missing or corrupt data, checkpoints, misspelled options, a mid-epoch
    resume under another data layout) and a non-finite loss end it with their message, not a traceback."""
    try:
        main(argv)
    except (MissingDataError, MissingCheckpointError, NonFiniteLossError, ConfigKeyError, ConfigFileError,
            AnnotationError, CorruptCheckpointError, CheckpointMismatchError, CorruptImageError, UnsafeCheckpointError,
            MidEpochResumeError, CheckpointWriteError) as error:
        sys.exit(f'error: {error}')


__all__: List[str] = ['run_tool', 'parse_train_args', 'parse_test_args', 'load_config', 'resolve_amp',
                      'apply_train_args', 'import_task_library', 'setup_distributed', 'prepare_train',
                      'check_model_files', 'train_main', 'prepare_test', 'test_main']
