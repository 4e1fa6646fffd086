"""What ``tools/train.py`` and ``tools/test.py`` do; the scripts only call :func:`train_main` / :func:`test_main`.

Each reads top to bottom: parse the arguments, load the config, apply the arguments (``--demo``, ``--cfg-options``,
the work dir, ``--amp``, ``--resume``...), run the pre-flight (:mod:`.preflight`), build the Runner, run it. One
pair of scripts serves mmdet, mmseg and mmpretrain configs: the library is chosen by the config's ``default_scope``.
Arguments follow mmdet's tools (``--resume`` with an optional path, ``--auto-scale-lr``, ...).
"""
import argparse
import contextlib
import copy
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

from mmvisatt.checkpoint import CheckpointDownloadError, CheckpointMismatchError, UnsafeCheckpointError
from . import preflight
from .demo import to_demo_config
from .guards import NonFiniteLossError
from .mid_epoch import MidEpochResumeError
from .preflight import (AnnotationError, ConfigKeyError, CorruptCheckpointError, CorruptImageError,
                        MissingCheckpointError, MissingDataError, WorkDirError)
from .reliability import (CheckpointWriteError, NothingToResumeError, TrainingPreempted, add_custom_hooks,
                          enable_reliable_training, handling_preemption)

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


class ConfigFileError(ValueError):
    """A config file (or one of its ``_base_`` files) that Python cannot parse."""


def find_config_syntax_error(path: str, _seen: Optional[set] = None) -> Optional[str]:
    """``file:line:column: message`` of the first syntax error in ``path`` or the ``_base_`` files it inherits
    (mmengine's own ``SyntaxError`` names no file), or None."""
    import ast
    seen = set() if _seen is None else _seen
    path = osp.abspath(path)
    if path in seen or not osp.isfile(path):
        return None
    seen.add(path)
    with open(path, encoding='utf-8') as f:
        source = f.read()
    try:
        ast.parse(source, filename=path)
    except SyntaxError as error:
        return f'{path}:{error.lineno}:{error.offset}: {error.msg}'
    for base in Config._get_base_files(path):
        if '::' in base:
            continue  # a package config (mmdet::...), not the user's
        found = find_config_syntax_error(osp.join(osp.dirname(path), base), seen)
        if found:
            return found
    return None


def _base_files(path: str) -> List[str]:
    """The ``_base_`` entries written in the config file ``path`` (as written, not resolved)."""
    import ast
    try:
        tree = ast.parse(open(path).read())
    except (OSError, SyntaxError):
        return []
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, 'id', None) == '_base_' for t in node.targets):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                return []
            return [value] if isinstance(value, str) else [v for v in value if isinstance(v, str)]
    return []


def _explain_missing_base(path: str, error: FileNotFoundError) -> Exception:
    """A ``_base_`` file that mmengine cannot find: mmengine reports the path it joined to the config's folder,
    which the user never wrote. Name the entry as written, and the fix when it exists relative to the working
    directory."""
    if not osp.isfile(path):
        return error
    folder = osp.dirname(osp.abspath(path))
    for base in _base_files(path):
        if osp.isabs(base) or osp.isfile(osp.join(folder, base)):
            continue
        hint = ''
        if osp.isfile(base):
            hint = (f' It exists relative to the working directory ({os.getcwd()}), but _base_ paths are relative to '
                    f"the config file's own folder: write {osp.relpath(osp.abspath(base), folder)!r}.")
        return ConfigFileError(f'{path}: its _base_ {base!r} is not a file (looked for {osp.join(folder, base)}).'
                               f'{hint}')
    return error


def load_config_file(path: str) -> Config:
    """``Config.fromfile`` whose syntax errors name the file and line, in the config or any ``_base_`` file."""
    try:
        return Config.fromfile(path)
    except FileNotFoundError as error:
        raise _explain_missing_base(path, error) from None
    except SyntaxError as error:
        where = find_config_syntax_error(path)
        if where is None:
            raise
        raise ConfigFileError(f'syntax error in a config file: {where}. Fix that file (configs inherit it '
                              'through _base_).') from error


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


def apply_arguments(cfg: Config, args: argparse.Namespace, train: bool) -> Optional[Config]:
    """Apply ``--demo``, ``--cfg-options`` (after the demo, so they can adjust it), ``--work-dir`` and
    ``--launcher`` to ``cfg`` in place; return the config as it was before the options were merged (None without
    options), which the pre-flight checks the option keys against."""
    if args.demo:
        keep_init = any(key.startswith('model.backbone.init_cfg') for key in args.cfg_options or {})
        to_demo_config(cfg, train=train, keep_backbone_init=keep_init)
    unmerged = None
    if args.cfg_options:
        unmerged = copy.deepcopy(cfg)
        try:
            cfg.merge_from_dict(args.cfg_options)
        except KeyError:
            # mmengine refuses an index past a list's end without naming the key; the pre-flight's option check
            # names it and the list's length
            preflight.check_cfg_options(unmerged, args.cfg_options)
            raise
    cfg.launcher = args.launcher
    if args.work_dir:
        cfg.work_dir = args.work_dir
    elif cfg.get('work_dir') is None:
        name = osp.splitext(osp.basename(args.config))[0]
        cfg.work_dir = osp.join('./work_dirs', name + ('_demo' if args.demo else ''))
    return unmerged


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
    on a CPU (:func:`resolve_amp`); the reliability hooks (atomic checkpoints, exact resume) are added."""
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
    return enable_reliable_training(cfg, args.resume)


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
    if cfg.get('launcher') == 'pytorch' and not torch.distributed.is_initialized():
        absent = [name for name in ('RANK', 'WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT') if name not in os.environ]
        if absent:
            raise ValueError(
                f'--launcher pytorch needs the process variables torchrun sets ({", ".join(absent)} missing): start '
                f'the job with bash tools/dist_train.sh CONFIG GPUS (or torchrun --nproc_per_node GPUS '
                f'tools/train.py CONFIG --launcher pytorch); for one process, drop --launcher.')
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
        explained = preflight.explain_build_error(error)
        if explained is None:
            raise
        raise explained from error


def prepare_train(argv: Optional[Sequence[str]] = None) -> Config:
    """Parse ``argv``, load the config, apply the arguments and run the pre-flight: the config :func:`train_main`
    builds its Runner from."""
    args = parse_train_args(argv)
    cfg = load_config_file(args.config)
    unmerged = apply_arguments(cfg, args, train=True)
    apply_train_args(cfg, args)
    scope = import_task_library(cfg)
    preflight.check_train(cfg, scope, args.config, args.cfg_options, unmerged)
    return cfg


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
            explained = preflight.explain_build_error(error)
        else:
            explained = preflight.explain_image_error(error, preflight.image_dirs(cfg))
        if explained is None:
            raise
        raise explained from error


def train_main(argv: Optional[Sequence[str]] = None) -> Runner:
    cfg = prepare_train(argv)
    with preflight.claim_work_dir(cfg.work_dir, cfg.get('launcher')):
        setup_distributed(cfg)
        runner = build_runner(cfg, cfg.default_scope)
        if cfg.get('resume') and cfg.get('load_from'):
            preflight.check_checkpoint_fits(
                runner.model, cfg.load_from,
                hint='--resume continues the model the checkpoint was saved from; to train another head or class '
                'count from its weights, pass --cfg-options load_from=PATH instead.')
        with _run_errors_explained(cfg), handling_preemption(runner):
            runner.train()
    return runner


def prepare_test(argv: Optional[Sequence[str]] = None) -> Tuple[Config, argparse.Namespace]:
    """Parse ``argv``, load the config, apply the arguments and run the pre-flight: the config :func:`test_main`
    builds its Runner from, and the arguments."""
    args = parse_test_args(argv)
    cfg = load_config_file(args.config)
    unmerged = apply_arguments(cfg, args, train=False)
    cfg.load_from = args.checkpoint
    add_custom_hooks(cfg, 'ChannelCheckHook')
    scope = import_task_library(cfg)
    if args.show_dir:
        cfg.default_hooks.visualization.draw = True
        if scope == 'mmdet':
            cfg.default_hooks.visualization.test_out_dir = args.show_dir
        else:
            cfg.visualizer.save_dir = args.show_dir
    if args.out and scope == 'mmseg':
        cfg.test_evaluator.update(output_dir=args.out, keep_results=True)
    preflight.check_test(cfg, scope, args.config, args.cfg_options, unmerged)
    return cfg, args


def test_main(argv: Optional[Sequence[str]] = None) -> dict:
    cfg, args = prepare_test(argv)
    setup_distributed(cfg)
    runner = build_runner(cfg, cfg.default_scope)
    preflight.check_checkpoint_fits(runner.model, cfg.load_from, args.demo)
    if args.out and cfg.default_scope == 'mmdet':
        from mmdet.evaluation import DumpDetResults
        runner.test_evaluator.metrics.append(DumpDetResults(out_file_path=args.out))
    with _run_errors_explained(cfg):
        return runner.test()


def run_tool(main: Callable[[Optional[Sequence[str]]], Any], argv: Optional[Sequence[str]] = None) -> None:
    """Run ``main`` as a command: bad input (missing or corrupt data, checkpoints, misspelled options, a mid-epoch
    resume under another data layout) and a non-finite loss end it with their message, not a traceback; a run stopped
    by SIGTERM / SIGUSR1 says where its checkpoint is and exits with the status the signal would have given."""
    try:
        main(argv)
    except TrainingPreempted as stop:
        from mmengine.dist import get_rank
        if get_rank() == 0:
            print(f'stopped: {stop}', file=sys.stderr, flush=True)
            # tools/dist_train.sh exits with it (torchrun reports any non-zero rank as a failure)
            if os.environ.get('MMVISATT_STOP_STATUS_FILE'):
                with open(os.environ['MMVISATT_STOP_STATUS_FILE'], 'w') as f:
                    f.write(str(stop.code))
        sys.exit(stop.code)
    except (MissingDataError, MissingCheckpointError, NonFiniteLossError, ConfigKeyError, ConfigFileError,
            AnnotationError, CorruptCheckpointError, CheckpointMismatchError, CorruptImageError, UnsafeCheckpointError,
            MidEpochResumeError, CheckpointWriteError, WorkDirError, CheckpointDownloadError,
            NothingToResumeError) as error:
        sys.exit(f'error: {error}')


__all__: List[str] = ['run_tool', 'parse_train_args', 'parse_test_args', 'load_config_file', 'apply_arguments',
                      'resolve_amp', 'apply_train_args', 'import_task_library', 'setup_distributed', 'build_runner',
                      'prepare_train', 'train_main', 'prepare_test', 'test_main', 'ConfigFileError']
