"""Bad input found early, with an error that names the problem and the fix.

Complements :mod:`.checks` (missing dataset / pretrained checkpoint) and the backbones' own checks (input
channels, minimum size, ``arch``, ``out_indices``):

* :func:`check_cfg_options`: a ``--cfg-options`` key that does not exist but is close to one that does
  (``train_cfg.max_iter``) is a typo, which mmengine would silently add as a new, unused key.
* :func:`check_coco_annotations`: a COCO annotation file with no images, no annotations, or annotations of a
  category it does not define (mmdet fails with a bare ``KeyError: 7`` deep in dataset loading).
* :func:`check_checkpoint_file`: a truncated ``load_from`` / ``--resume`` / ``Pretrained`` file.
* :class:`ChannelCheckHook`: a neck whose ``in_channels`` differ from the backbone's outputs (otherwise a bare
  convolution shape error at the first forward).
* :func:`explain_image_error`: an image file OpenCV cannot decode (mmcv asserts ``failed to load image``).
"""
import difflib
import importlib
import inspect
import json
import os.path as osp
import re
from typing import Any, Dict, List, Optional, Sequence

import torch
from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS

from mmvisatt.checkpoint import (CheckpointMismatchError, convert_backbone_layout, convert_state_dict, file_head,
                                 load_checkpoint_file, not_a_checkpoint, unwrap_state_dict)
from mmvisatt.checkpoint.loading import abbreviate
from mmvisatt.datasets.transforms import CorruptImageError, image_truncation, truncated_image_message
from .checks import leaf_datasets
from .reliability import checkpoint_problem

# Annotation files above this size are left to the dataset: reading them twice would cost seconds of start-up and
# gigabytes of memory, and the big public sets are known to be consistent. The check is for hand-made sets.
MAX_CHECKED_ANN_BYTES = 64 * 2**20


class ConfigKeyError(KeyError):
    """A ``--cfg-options`` key is (almost certainly) misspelled."""

    def __str__(self) -> str:  # KeyError would print the repr of the message
        return str(self.args[0])


class AnnotationError(ValueError):
    """An annotation file cannot be used with the config."""


class CorruptCheckpointError(RuntimeError):
    """A checkpoint file is incomplete or corrupt."""


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


def load_config_file(path: str) -> Config:
    """``Config.fromfile`` whose syntax errors name the file and line, in the config or any ``_base_`` file."""
    try:
        return Config.fromfile(path)
    except SyntaxError as error:
        where = find_config_syntax_error(path)
        if where is None:
            raise
        raise ConfigFileError(f'syntax error in a config file: {where}. Fix that file (configs inherit it '
                              'through _base_).') from error


def _ann_file(dataset: dict) -> Optional[str]:
    ann = dataset.get('ann_file')
    if not ann:
        return None
    root = dataset.get('data_root')
    return ann if root is None or osp.isabs(ann) else osp.join(root, ann)


def check_evaluator_files(cfg: Config) -> None:
    """Raise :class:`AnnotationError` when ``val_evaluator`` / ``test_evaluator`` score against another annotation
    file than their dataset loads (data moved with ``--cfg-options *.dataset.data_root=...`` while the
    evaluator's ``ann_file`` still names the old one): the scores would silently be against another set."""
    problems = []
    for loader, evaluator in (('val_dataloader', 'val_evaluator'), ('test_dataloader', 'test_evaluator')):
        metrics = cfg.get(evaluator)
        datasets = list(leaf_datasets((cfg.get(loader) or {}).get('dataset')))
        if not metrics or len(datasets) != 1:
            continue
        dataset_file = _ann_file(datasets[0])
        for i, metric in enumerate(metrics if isinstance(metrics, (list, tuple)) else [metrics]):
            metric_file = metric.get('ann_file') if isinstance(metric, dict) else None
            if not metric_file or not dataset_file or osp.normpath(metric_file) == osp.normpath(dataset_file):
                continue
            key = f'{evaluator}.ann_file' if not isinstance(metrics, (list, tuple)) else f'{evaluator}.{i}.ann_file'
            problems.append(f'{key} is {metric_file}, but {loader} loads {dataset_file}: the scores would be '
                            f'computed against another set. Pass --cfg-options {key}={dataset_file}')
    if problems:
        raise AnnotationError('\n'.join(problems))


def read_coco_file(path: str) -> Any:
    """The parsed JSON of ``path``; invalid JSON is an :class:`AnnotationError`."""
    with open(path) as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as error:
            raise AnnotationError(f'{path} is not valid JSON ({error}); re-export or re-download it.') from None


def check_coco_annotations(path: str, train: bool = True, data: Any = None) -> None:
    """Raise :class:`AnnotationError` if the COCO file at ``path`` (or its parsed ``data``) is not valid JSON, has
    no images, (for training) no annotations, or annotations whose ``category_id`` is not among its
    ``categories``. How the file fits the config's classes and model is
    :func:`mmvisatt.engine.preflight.preflight`'s part."""
    data = read_coco_file(path) if data is None else data
    if not isinstance(data, dict):
        raise AnnotationError(f'{path} is not a COCO instances file: it holds a {type(data).__name__}, not an '
                              f'object with "images", "annotations" and "categories".')
    missing = [k for k in ('images', 'annotations', 'categories') if k not in data]
    if missing:
        raise AnnotationError(f'{path} is not a COCO instances file: it has no {missing} (it needs "images", '
                              f'"annotations" and "categories" lists).')
    if not data['images']:
        raise AnnotationError(f'{path} lists no images; point ann_file at the right split or add the images.')
    if train and not data['annotations']:
        raise AnnotationError(f'{path} has images but no annotations: a detector cannot be trained on it (every '
                              f'image would be filtered out as empty). Check that you exported the instances file.')
    names = {c['id']: c.get('name') for c in data['categories']}
    counts: Dict[Any, int] = {}
    for ann in data['annotations']:
        cat = ann.get('category_id')
        if cat not in names:
            counts[cat] = counts.get(cat, 0) + 1
    if counts:
        listed = ', '.join(f'{c} ({n} annotations)' for c, n in sorted(counts.items(), key=lambda x: str(x[0])))
        raise AnnotationError(f'{path}: annotations use category_id {listed}, which "categories" does not define '
                              f'(defined: {sorted(names.items())}). Add the categories or drop those annotations.')


def check_checkpoint_file(path: Optional[str], what: str, fix: str, zip_only: bool = False) -> Optional[dict]:
    """Raise :class:`CorruptCheckpointError` if the local checkpoint ``path`` is incomplete; return what it holds
    (memory-mapped; None for a URL, a missing file or one left to its loader).

    Zip-format files (``torch.save`` since torch 1.6) are checked fully. Files in the legacy pickle format cannot be
    checked without loading them and pass; so does anything else when ``zip_only`` (foreign files, e.g. an official
    release, are then left to the loader). Every torch file is then read as data (memory-mapped where it can be):
    one that holds more than tensors and plain data raises :class:`UnsafeCheckpointError` before the run starts.
    """
    if not path or '://' in path:
        return None
    path = osp.expanduser(path)
    if not osp.isfile(path):
        return None
    head = file_head(path)
    problem = not_a_checkpoint(path, head)
    if problem is not None:
        raise CorruptCheckpointError(f'{what} {path} is {problem}.')
    zipped = head.startswith(b'PK\x03\x04')
    if head[:1] != b'\x80' and (zipped or not zip_only):
        problem = checkpoint_problem(path)
        if problem is not None:
            raise CorruptCheckpointError(f'{what} {path} is {problem}. {fix}')
    return load_checkpoint_file(path, 'cpu', mmap=True) if zipped or head[:1] == b'\x80' else None


def check_load_from_fits(model_cfg: Any, path: str, checkpoint: Optional[dict]) -> None:
    """Refuse a ``load_from`` file (``checkpoint``: what it holds, from :func:`check_checkpoint_file`) none of whose
    keys belongs to a part of the model (a backbone-only ImageNet file, say): mmengine would load nothing, say
    nothing, and train the model from its initialisation."""
    if checkpoint is None or not isinstance(model_cfg, dict):
        return
    parts = sorted(k for k, v in model_cfg.items() if isinstance(v, dict) and k != 'data_preprocessor')
    state = unwrap_state_dict(checkpoint)
    if not state or not parts or any(k.split('.', 1)[0] in parts for k in state):
        return
    try:
        _, family, layout = convert_state_dict(state)
        what = f'a {family} backbone alone ({layout} layout, e.g. an ImageNet checkpoint)'
    except CheckpointMismatchError:
        what = f'weights of another model (first keys: {abbreviate(sorted(state), 4)})'
    raise CheckpointMismatchError(
        f'load_from {path} holds {what}: none of its keys belongs to the model\'s {", ".join(parts)}. load_from '
        f'matches whole-model keys, so nothing would load and the model would train from its initialisation. To '
        f'start the backbone from this file, pass --cfg-options model.backbone.init_cfg.type=Pretrained '
        f'model.backbone.init_cfg.checkpoint={path} instead of load_from.')


def _channel_list(value: Any) -> Optional[List[int]]:
    if isinstance(value, int):
        return [value]
    if isinstance(value, (list, tuple)) and all(isinstance(v, int) for v in value):
        return list(value)
    return None


def _path_in_config(model: torch.nn.Module, module: torch.nn.Module) -> str:
    for name, child in model.named_children():
        if child is module:
            return f'model.{name}'
    return 'model.neck'


@HOOKS.register_module()
class ChannelCheckHook(Hook):
    """At the first forward, check that the neck's ``in_channels`` are what the backbone outputs.

    Raises a ``ValueError`` naming both channel lists and the config key to change instead of the convolution
    shape error mmdet/mmseg would give. Models without a ``backbone`` and a ``neck`` with ``in_channels`` are left
    alone. ``tools/train.py`` / ``tools/test.py`` add it.
    """

    priority = 'VERY_HIGH'

    def __init__(self) -> None:
        self._handle = None

    def _install(self, runner) -> None:
        if self._handle is not None:
            return
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        backbone, neck = getattr(model, 'backbone', None), getattr(model, 'neck', None)
        if isinstance(neck, (list, torch.nn.Sequential)) or neck is None or backbone is None:
            return
        expected = _channel_list(getattr(neck, 'in_channels', None))
        if expected is None:
            return
        key = _path_in_config(model, neck) + '.in_channels'

        def check(module, args, output):
            self._handle.remove()
            outs = output if isinstance(output, (list, tuple)) else [output]
            got = [o.shape[1] for o in outs if isinstance(o, torch.Tensor) and o.dim() >= 2]
            if got != expected:
                indices = getattr(backbone, 'out_indices', None)
                which = f' (out_indices={tuple(indices)})' if indices is not None else ''
                raise ValueError(
                    f'{key}={expected} does not match the backbone: {type(backbone).__name__}{which} outputs '
                    f'{len(got)} feature maps with channels {got}. Set {key}={got} (or change the backbone\'s '
                    f'arch / out_indices).')

        self._handle = backbone.register_forward_hook(check)

    def before_train(self, runner) -> None:
        self._install(runner)

    def before_val(self, runner) -> None:
        self._install(runner)

    def before_test(self, runner) -> None:
        self._install(runner)


@HOOKS.register_module()
class BackboneLayoutHook(Hook):
    """Convert the backbone of a ``load_from`` checkpoint whose backbone is in another layout a converter knows (a
    whole mmdet Swin detector for ReSwin), and refuse one whose backbone fits neither way.

    mmengine loads ``load_from`` with ``strict=False``: without this the backbone of such a file would silently stay
    at its initialisation while the neck and heads load. ``tools/train.py`` adds it.
    """

    priority = 'VERY_HIGH'

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        backbone, state = getattr(model, 'backbone', None), checkpoint.get('state_dict')
        if not isinstance(backbone, torch.nn.Module) or not isinstance(state, dict):
            return
        source = runner.cfg.get('load_from') or 'the checkpoint'
        if not any(k.startswith(('backbone.', 'module.backbone.')) for k in state):
            raise CheckpointMismatchError(
                f"{source} has no 'backbone.' weights (first keys: {', '.join(list(state)[:4])}): the backbone would "
                f"stay at its initialisation. An ImageNet checkpoint of the backbone goes in its init_cfg "
                f"(--cfg-options model.backbone.init_cfg.checkpoint=PATH), not in load_from.")
        try:
            converted = convert_backbone_layout(state, backbone.state_dict().keys())
        except CheckpointMismatchError as error:
            raise CheckpointMismatchError(f'{source}: {error}') from None
        if converted is not None:
            checkpoint['state_dict'], family, layout = converted
            print_log(f'{source}: backbone weights converted from the {layout} layout ({family} converter) for '
                      f'{type(backbone).__name__}.', logger='current')


_FAILED_IMAGE = re.compile(r'failed to load image: (\S+)')


def explain_image_error(error: BaseException, image_dirs: Sequence[str] = ()) -> Optional[CorruptImageError]:
    """A :class:`CorruptImageError` for mmcv's ``failed to load image: PATH`` assertion, for OpenCV's refusal of an
    empty file (which names no file: ``image_dirs`` are the folders to search) or for a :class:`CorruptImageError`
    (``CheckImageIntegrity``), also when re-raised from a dataloader worker, else None."""
    if '!buf.empty()' in str(error):
        where = ' '.join(image_dirs) or 'the image folders'
        return CorruptImageError(
            f'An image file is empty (0 bytes): OpenCV refuses it without naming it. Find such files with '
            f'`find {where} -size 0` and replace them (re-download or re-copy), or remove them from the annotation '
            f'file.')
    if isinstance(error, CorruptImageError):
        # a worker's error arrives as 'Caught ... Original Traceback ...': keep the message, not the traceback
        _, _, message = str(error).rpartition(f'{CorruptImageError.__name__}: ')
        return CorruptImageError(message.strip())
    # the last match: a worker's traceback also quotes the source line, "f'failed to load image: {filename}'"
    paths = _FAILED_IMAGE.findall(str(error))
    if not isinstance(error, AssertionError) or not paths:
        return None
    path = paths[-1].rstrip("'\"")
    problem = image_truncation(path) if osp.isfile(path) else None
    if problem is not None:
        return CorruptImageError(truncated_image_message(path, problem))
    return CorruptImageError(
        f'Image {path} cannot be decoded: the file is corrupt, truncated to nothing, or not an image. Replace it '
        f'(re-download or re-encode), or remove it from the annotation file. Grayscale and RGBA images are fine: '
        f'they are converted to 3-channel colour on loading.')


__all__ = ['ConfigKeyError', 'AnnotationError', 'CorruptCheckpointError', 'CorruptImageError', 'check_cfg_options',
           'check_legacy_keys', 'explain_build_error', 'check_top_level_keys', 'LEGACY_KEYS', 'ConfigFileError',
           'find_config_syntax_error', 'load_config_file', 'check_evaluator_files',
           'check_coco_annotations', 'read_coco_file', 'check_checkpoint_file', 'ChannelCheckHook',
           'BackboneLayoutHook',
           'explain_image_error', 'truncated_image_message', 'MAX_CHECKED_ANN_BYTES']
