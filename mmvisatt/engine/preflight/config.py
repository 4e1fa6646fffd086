"""The config's keys checked against what reads them: a ``--cfg-options`` key that misses the config by a typo
(mmengine would silently add it as a new, unused key), mmdet / mmseg 2.x keys that the 3.x Runner ignores, a
top-level key that is a typo of one the Runner reads, and (when a build fails) a key a class does not take."""
import difflib
import importlib
import inspect
import re
from typing import Any, Dict, List, Optional, Sequence

from mmengine.config import Config


class ConfigKeyError(KeyError):
    """A ``--cfg-options`` key is (almost certainly) misspelled."""

    def __str__(self) -> str:  # KeyError would print the repr of the message
        return str(self.args[0])


def _children(node: Any) -> Optional[List[str]]:
    if isinstance(node, (dict, Config)):
        return [str(k) for k in node.keys()]
    return None


def check_cfg_options(cfg: Config, options: Optional[Dict[str, Any]], cutoff: float = 0.8) -> None:
    """Raise :class:`ConfigKeyError` for ``options`` keys that miss the config by a typo.

    A key is followed down the config as far as it exists. Where it leaves the config, the missing part is
    compared with the keys that exist at that level; a close match (``difflib`` ratio >= ``cutoff``) means a typo.
    A new key with no close match is allowed (e.g. ``default_hooks.trace.type=TrainingTraceHook`` adds a hook).
    """
    problems = []
    for key in options or {}:
        node: Any = cfg
        parts = key.split('.')
        for depth, part in enumerate(parts):
            if isinstance(node, (list, tuple)) and part.isdigit():
                if int(part) >= len(node):
                    problems.append(f'{key}: {".".join(parts[:depth]) or "the config"} has only {len(node)} '
                                    f'entries (index {part})')
                    break
                node = node[int(part)]
                continue
            siblings = _children(node)
            if siblings is None or part in siblings:
                if siblings is None:
                    break  # below a value (e.g. a list replaced whole): mmengine decides
                node = node[part]
                continue
            close = difflib.get_close_matches(part, [s for s in siblings if not s.startswith('_')], n=3,
                                              cutoff=cutoff)
            if close:
                prefix = '.'.join(parts[:depth])
                names = ', '.join((f'{prefix}.{c}' if prefix else c) for c in close)
                problems.append(f'{key}: no key {part!r} there; did you mean {names}?')
            break
    if problems:
        raise ConfigKeyError('--cfg-options: unknown key(s), probably misspelled:\n  ' + '\n  '.join(problems) +
                             '\n(A genuinely new key with a name this close to an existing one: put it in a config '
                             'that inherits from this one.)')


# mmdet / mmseg 2.x (mmcv runner) config keys, which 3.x configs ignore, and where their settings live now
LEGACY_KEYS = {
    'optimizer': 'optim_wrapper.optimizer (optim_wrapper=dict(optimizer=dict(type=..., lr=...)))',
    'optimizer_config': 'optim_wrapper (clip_grad=...; AmpOptimWrapper or --amp for fp16)',
    'lr_config': 'param_scheduler (a list, e.g. LinearLR warm-up then MultiStepLR)',
    'runner': 'train_cfg (type=EpochBasedTrainLoop, max_epochs=... or IterBasedTrainLoop, max_iters=...)',
    'total_epochs': 'train_cfg.max_epochs',
    'data': 'train_dataloader / val_dataloader / test_dataloader (samples_per_gpu -> batch_size, '
            'workers_per_gpu -> num_workers, train/val/test -> dataset)',
    'resume_from': 'tools/train.py --resume PATH',
    'evaluation': 'val_evaluator (the metric) and train_cfg.val_interval (how often)',
    'checkpoint_config': 'default_hooks.checkpoint (interval=..., max_keep_ckpts=...)',
    'log_config': 'default_hooks.logger (interval=...) and visualizer.vis_backends',
    'workflow': 'train_cfg / val_cfg (loops replace workflows)',
    'dist_params': 'env_cfg.dist_cfg',
    'fp16': 'tools/train.py --amp (or optim_wrapper.type=AmpOptimWrapper)',
    'gpu_ids': 'CUDA_VISIBLE_DEVICES and --launcher',
}


def check_legacy_keys(cfg: Config, source: str) -> None:
    """Raise :class:`ConfigKeyError` for mmdet / mmseg 2.x keys, which the 3.x Runner would silently ignore."""
    found = [key for key in LEGACY_KEYS if key in cfg]
    if found:
        lines = [f'{key} (2.x) -> {LEGACY_KEYS[key]}' for key in found]
        raise ConfigKeyError(f'{source}: mmdet/mmseg 2.x key(s) that 3.x configs ignore; move each setting to its '
                             '3.x name:\n  ' + '\n  '.join(lines))


def _registered_class(name: str) -> Optional[type]:
    """The class registered as ``name`` in any registry of mmengine or of the current default scope."""
    from mmengine.registry import DefaultScope, Registry
    modules = ['mmengine.registry']
    scope = DefaultScope.get_current_instance()
    if scope is not None and scope.scope_name != 'mmengine':
        modules.insert(0, f'{scope.scope_name}.registry')
    for module in modules:
        try:
            registries = vars(importlib.import_module(module)).values()
        except ImportError:
            continue
        for registry in registries:
            if isinstance(registry, Registry):
                cls = registry.get(name)
                if isinstance(cls, type):
                    return cls
    return None


def explain_build_error(error: TypeError, cutoff: float = 0.6) -> Optional[ConfigKeyError]:
    """A :class:`ConfigKeyError` for a registry build that failed on an unexpected keyword (a key the class does
    not take, from a config: a model part, a loop, a hook, an optimizer...), naming the class and its closest
    arguments; None for other errors."""
    match = re.search(r"(\w+)\.__init__\(\) got an unexpected keyword argument '(\w+)'", str(error))
    if not match:
        return None
    cls_name, key = match.groups()
    cls = _registered_class(cls_name)
    params = [] if cls is None else [n for n in inspect.signature(cls.__init__).parameters
                                     if n not in ('self', 'args', 'kwargs')]
    close = difflib.get_close_matches(key, params, n=3, cutoff=cutoff)
    if close:
        hint = f'did you mean {", ".join(close)}?'
    elif params:
        hint = f'it takes: {", ".join(params)}'
    else:
        hint = 'remove it or check the class\'s documentation for its arguments'
    return ConfigKeyError(f"the config gives {cls_name} the key {key!r}, which it does not take; {hint}")


# Top-level keys that mmengine reads besides the Runner's arguments, or that configs use as variables
_OTHER_RUNNER_KEYS = ('model_wrapper_cfg', 'compile', 'strategy', 'runner_type', 'custom_imports')


def check_top_level_keys(cfg: Config, source: str, cutoff: float = 0.8) -> None:
    """Raise :class:`ConfigKeyError` for a top-level key that is a typo of one the Runner reads
    (``optim_wraper``, ``val_evaluater``): the Runner ignores unknown top-level keys, so the run would silently
    use the base's value."""
    from mmengine.runner import Runner
    known = [n for n in inspect.signature(Runner.__init__).parameters if n != 'self'] + list(_OTHER_RUNNER_KEYS)
    problems = []
    for key in cfg.keys():
        if key in known:
            continue
        close = difflib.get_close_matches(key, known, n=1, cutoff=cutoff)
        if close:
            problems.append(f'{source} sets {key!r}, which the Runner does not read (the run would ignore it); '
                            f'did you mean {close[0]!r}?')
    if problems:
        raise ConfigKeyError('\n'.join(problems))


def check_compile_memory_paths(cfg: Config) -> List[str]:
    """Warn (and return the warnings) where ``compile`` is on and the backbone keeps its score maps by a chunked
    strategy (``score_memory='handoff'`` or ``'factors'``), whose row-chunk loops torch.compile does not trace."""
    if not cfg.get('compile'):
        return []
    from mmengine.logging import print_log
    backbone = (cfg.get('model') or {}).get('backbone') or {}
    strategy = backbone.get('score_memory', 'full')
    if strategy == 'full':
        return []
    warnings = [f"compile=True with model.backbone.score_memory={strategy!r}: the strategy's row-chunk loops are "
                'Python loops over the sizes, which torch.compile does not trace, so every block breaks the graph '
                'and attends eagerly between compiled pieces (the memory cut holds, the fusion does not). '
                "score_memory='full' compiles whole, at the training peak of the score maps (docs/performance.md)."]
    for message in warnings:
        print_log(message, logger='current', level=30)
    return warnings


# evaluator type -> the setting that says where format_only writes the predictions
_FORMAT_ONLY_OUTPUT = {'CocoMetric': 'outfile_prefix', 'CityscapesMetric': 'outfile_prefix',
                       'IoUMetric': 'output_dir', 'CityscapesMetricSeg': 'output_dir'}


def check_format_only(cfg: Config, keys: Sequence[str] = ('val_evaluator', 'test_evaluator')) -> None:
    """An evaluator with ``format_only=True`` writes the predictions in the benchmark server's format instead of
    scoring them, and needs to be told where: mmdet otherwise stops after the whole test run with 'outfile_prefix
    must be not None when format_only is True'."""
    for key in keys:
        evaluators = cfg.get(key)
        evaluators = evaluators if isinstance(evaluators, (list, tuple)) else [evaluators]
        for i, evaluator in enumerate(evaluators):
            if not isinstance(evaluator, dict) or not evaluator.get('format_only'):
                continue
            kind = str(evaluator.get('type', '')).split('.')[-1]
            setting = _FORMAT_ONLY_OUTPUT.get(kind)
            if setting and not evaluator.get(setting):
                where = key if len(evaluators) == 1 else f'{key}.{i}'
                example = 'work_dirs/results/coco' if setting == 'outfile_prefix' else 'work_dirs/results'
                raise ConfigKeyError(
                    f'{where}.format_only=True writes the predictions for submission instead of scoring them, and '
                    f'needs where to write them: add --cfg-options {where}.{setting}={example} (or set format_only='
                    f'False to evaluate).')
