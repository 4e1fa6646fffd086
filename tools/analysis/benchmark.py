"""Speed and memory of a backbone or of a whole detector / segmentor / classifier config.

What is measured, on a synthetic batch of the requested resolution and batch size:

- ``inference``: latency of one forward pass in eval mode without gradients (a config's ``test_step``, i.e. data
  preprocessing + prediction with its post-processing), after warm-up passes; median, quartiles and spread of the
  repeats, and throughput (images / s at the median).
- ``train``: time of one training step: forward, loss, backward and optimizer step (a backbone is trained on the
  mean of its outputs with AdamW; a config with its own ``optim_wrapper`` optimizer and its losses on a synthetic
  batch of the right kind: boxes and masks for mmdet, label maps for mmseg, labels for mmpretrain).
- ``inference-memory`` / ``train-memory``: the peak memory of ``memory_steps`` such passes. On CUDA it is the
  allocator's ``max_memory_allocated``; on CPU every measurement runs in a fresh subprocess whose resident-set
  high-water mark (``VmHWM`` in ``/proc/self/status``, reset through ``/proc/self/clear_refs`` once the model and
  batch are built) is read after the passes, so peaks of one measurement cannot leak into another. glibc is told
  to serve large blocks with mmap (``MALLOC_MMAP_THRESHOLD_``) so that freed activations leave the resident set
  and the RSS follows what the tensors hold. ``step_peak_mib`` is the peak above the memory held once the model
  and batch exist (on CPU that baseline includes the interpreter and libraries, reported as ``baseline_mib``).

``clock`` ``'wall'`` (default) times with ``time.perf_counter``; ``'cpu'`` with the process's CPU time
(``time.process_time``, CPU only), which on a machine shared with other jobs leaves out the waits for a core. CPU
time sums all threads of the process, so with more than one torch thread it is work, not latency; it includes the
kernel's time for the process (page faults of fresh allocations), which is part of the cost. With it every timed
measurement also reports ``cpu_split``: the user time, the system time and the minor page faults of each pass
(``getrusage``, where the OS has it). System time is mostly the kernel zeroing fresh pages for large tensors; it
varies from run to run with the machine's memory state, while user time is the computation.

``allocator`` (CPU timing): ``jemalloc`` preloads jemalloc with freed memory kept
(``MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1``; Debian ``libjemalloc2``), ``glibc-retain`` tells glibc to
keep freed memory (``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_`` / ``MALLOC_TOP_PAD_``), ``default``
leaves the environment as it is. Large activations otherwise come back from the kernel as fresh pages on every
pass, and their page faults are system time the model code cannot remove (docs/development.md). The command
re-executes itself with the setting, which must be in place before the process starts; the memory subprocesses
keep their own glibc setting.

``dtype`` ``bf16`` / ``fp16`` mean autocast mixed precision with float32 weights (what mmengine's
``AmpOptimWrapper`` does); fp16 training scales the loss with a ``GradScaler``.

On CUDA every pass is timed by CUDA events. A timed backbone also reports its FLOPs (one inference forward of the
batch, counted by the model zoo's counter on the meta device, 2 per multiply-add) and the achieved TFLOP/s of each
mode (a training step counted as three forwards), as a share of the device's peak: a large matrix product's rate
measured in the same run and dtype, or the value given. Several models run side by side in one process (the
first is the reference of the others' ratios); ``timm.NAME`` is a timm model's multi-scale features
(:class:`TimmFeatures`), and a suite (:data:`SUITES`) names a set of models with its targets
(:data:`SUITE_TARGETS`).

It is a development tool beside the package, not part of it (``import mmvisatt`` never loads it):

    python tools/analysis/benchmark.py --backbone RMT --arch t --shape 800 1216
    python tools/analysis/benchmark.py configs/mask_rcnn_reswin_t_1x.py --shape 800 1216 --batch-size 2 \\
        --measure train-memory --with-cp --out bench.json
    python tools/analysis/benchmark.py --backbone reswin_t --compare mmdet.SwinTransformer --dtype bf16

``docs/benchmarks.md`` holds measured tables.
"""
import argparse
import ast
import contextlib
import copy
import gc
import json
import logging
import os
import os.path as osp
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.config import Config, ConfigDict, DictAction
from mmengine.registry import MODELS, DefaultScope

CONFIG_DIR = osp.join(osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))), 'configs')
DTYPES = {'float32': torch.float32, 'bf16': torch.bfloat16, 'fp16': torch.float16}
DTYPE_ALIASES = {'fp32': 'float32', 'bfloat16': 'bf16', 'float16': 'fp16', 'half': 'fp16'}
MEASUREMENTS = ('inference', 'train', 'inference-memory', 'train-memory')
CLOCKS = {'wall': time.perf_counter, 'cpu': time.process_time}
TASK_SCOPES = ('mmdet', 'mmseg', 'mmpretrain')
_RESULT_MARK = 'BENCHMARK-RESULT '
JEMALLOC_LIBRARIES = ('/usr/lib/x86_64-linux-gnu/libjemalloc.so.2', '/usr/lib/aarch64-linux-gnu/libjemalloc.so.2',
                      '/usr/lib64/libjemalloc.so.2', '/usr/lib/libjemalloc.so.2', '/usr/local/lib/libjemalloc.so.2')
GLIBC_RETAIN = dict(MALLOC_MMAP_THRESHOLD_='4294967296', MALLOC_TRIM_THRESHOLD_='68719476736',
                    MALLOC_TOP_PAD_='1073741824')
ALLOCATORS = ('default', 'jemalloc', 'glibc-retain')
_ALLOCATOR_MARK = 'MMVISATT_ALLOCATOR'
_ALLOCATOR_VARS = ('LD_PRELOAD', 'MALLOC_CONF', *GLIBC_RETAIN)
_MIB = 2.0 ** 20
TIMM_PREFIX = 'timm.'
# the models the GPU table compares side by side in one process (docs/benchmarks.md): every form's T-size preset
# (ReViT's smallest is B) and timm's Swin-T and MViTv2-T, the anchors users compare with
#: timm names of plain (single-scale) ViTs, whose features are block outputs
PLAIN_VITS = ('vit_', 'deit_', 'deit3_')
SUITES = {
    't-presets': ('reswin_t', 'remvit_t', 'revit_b', 'rmt_t', 'evt_t', 'evt_swin_t', 'fan_vit_t', 'fan_hybrid_t',
                  'fan_swin_t', 'shunted_t', 'timm.swin_tiny_patch4_window7_224', 'timm.mvitv2_tiny'),
}


def write_between_markers(path: str, name: str, body: str) -> None:
    """Replace what stands between ``<!-- NAME: begin -->`` and ``<!-- NAME: end -->`` in the page ``path``."""
    begin, end = f'<!-- {name}: begin -->', f'<!-- {name}: end -->'
    with open(path) as f:
        text = f.read()
    if begin not in text or end not in text:
        raise ValueError(f'{path} has no {begin} ... {end} section to write the table into')
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    with open(path, 'w') as f:
        f.write(f'{head}{begin}\n{body}\n{end}{tail}')


class BenchmarkError(ValueError):
    """A benchmark request that cannot run as asked (unknown model, unsupported dtype, ...); says how to fix it."""


@dataclass
class ModelSpec:
    """What to build.

    ``source`` is a backbone type of the registry (``RMT``, ``mmdet.SwinTransformer``), a backbone preset name
    (``reswin_t`` = ``preset.backbone`` of ``configs/_base_/backbones/reswin_t.py``) or a config file (its whole
    ``model``, or only ``model.backbone`` with ``backbone_only``). ``arch`` (name or dict) replaces the backbone's
    ``arch``; ``options`` are merged into the backbone dict, ``cfg_options`` into a config. Pretrained
    initialisation is always switched off, and SyncBN becomes BN outside a distributed run.
    """
    source: str
    arch: Optional[Union[str, dict]] = None
    options: Dict[str, Any] = field(default_factory=dict)
    cfg_options: Dict[str, Any] = field(default_factory=dict)
    backbone_only: bool = False
    config_dir: str = CONFIG_DIR

    @property
    def label(self) -> str:
        name = osp.basename(self.source) if self.is_config else self.source
        if isinstance(self.arch, dict):
            name += ':custom'
        elif self.arch:
            name += f':{self.arch}'
        return name + (' (backbone)' if self.is_config and self.backbone_only else '')

    @property
    def is_config(self) -> bool:
        return self.source.endswith('.py') or osp.isfile(self.source)


@dataclass
class BenchmarkSettings:
    """How to measure. ``shape`` is (height, width); ``with_cp`` None keeps the backbone's own setting;
    ``threads`` None keeps torch's default (``OMP_NUM_THREADS``); ``clock`` see the module docstring;
    ``boxes_per_image``: instances in each image of a detector's synthetic batch; ``score_chunk_numel`` None keeps
    the global row-chunk size of the ReViT family's chunked score strategies (``set_score_chunk_numel``)."""
    shape: Tuple[int, int] = (224, 224)
    batch_size: int = 1
    dtype: str = 'float32'
    device: str = 'cpu'
    with_cp: Optional[bool] = None
    warmup: int = 3
    repeats: int = 10
    memory_steps: int = 2
    threads: Optional[int] = None
    seed: int = 0
    clock: str = 'wall'
    boxes_per_image: int = 8
    score_chunk_numel: Optional[int] = None

    def apply(self) -> None:
        """The process-wide settings: torch's threads and the score row-chunk size."""
        if self.threads:
            torch.set_num_threads(self.threads)
        if self.score_chunk_numel:
            from mmvisatt.models.layers.score_memory import set_score_chunk_numel
            set_score_chunk_numel(self.score_chunk_numel)

    def __post_init__(self):
        self.dtype = DTYPE_ALIASES.get(self.dtype, self.dtype)
        if self.dtype not in DTYPES:
            raise BenchmarkError(f"Unknown dtype '{self.dtype}'; choose one of {sorted(DTYPES)}.")
        self.shape = tuple(int(s) for s in self.shape)
        if len(self.shape) != 2 or min(self.shape) < 1:
            raise BenchmarkError(f'shape must be two positive integers (height, width), got {self.shape}.')
        for name in ('batch_size', 'repeats', 'memory_steps', 'boxes_per_image'):
            if getattr(self, name) < 1:
                raise BenchmarkError(f'{name} must be at least 1, got {getattr(self, name)}.')
        if self.warmup < 0:
            raise BenchmarkError(f'warmup must be 0 or more, got {self.warmup}.')
        if self.device.startswith('cuda') and not torch.cuda.is_available():
            raise BenchmarkError(f"device '{self.device}' requested but CUDA is not available; use --device cpu.")
        if self.clock not in CLOCKS:
            raise BenchmarkError(f"Unknown clock '{self.clock}'; choose one of {sorted(CLOCKS)}.")
        if self.clock == 'cpu' and torch.device(self.device).type != 'cpu':
            raise BenchmarkError(f"clock 'cpu' measures this process's CPU time, which leaves out the work of "
                                 f"device '{self.device}'; use --clock wall there.")


# ----------------------------------------------------------------------------------------------------------------
# Resolving and building models


def parse_arch(text: Optional[str]) -> Optional[Union[str, dict]]:
    """``'t'`` stays a name; ``"{'embed_dims': 16, ...}"`` becomes a dict."""
    if text is None or not text.strip().startswith('{'):
        return text
    try:
        arch = ast.literal_eval(text)
    except (ValueError, SyntaxError) as error:
        raise BenchmarkError(f'--arch {text!r} is not a valid Python dict literal ({error}).') from None
    if not isinstance(arch, dict):
        raise BenchmarkError(f'--arch {text!r} must be a preset name or a dict.')
    return arch


def parse_spec(text: str, **kwargs) -> ModelSpec:
    """``'RMT:t'``, ``'mmdet.SwinTransformer'``, ``'reswin_t'`` or ``'configs/x.py'`` -> :class:`ModelSpec`."""
    if text.endswith('.py') or osp.isfile(text):
        return ModelSpec(text, **kwargs)
    source, _, arch = text.partition(':')
    given = kwargs.pop('arch', None)
    if arch and given is not None:
        raise BenchmarkError(f"'{text}' already names an arch; drop --arch {given}.")
    return ModelSpec(source, arch=parse_arch(arch) if arch else given, **kwargs)


def backbone_presets(config_dir: str = CONFIG_DIR) -> List[str]:
    """Names of the backbone presets (``configs/_base_/backbones/*.py``)."""
    folder = osp.join(config_dir, '_base_', 'backbones')
    return sorted(f[:-3] for f in os.listdir(folder) if f.endswith('.py')) if osp.isdir(folder) else []


def _registry_has(name: str) -> bool:
    scope, _, _ = name.rpartition('.')
    if scope and scope not in TASK_SCOPES:
        return False
    if scope:
        _import_scope(scope)
    return MODELS.get(name) is not None


def _import_scope(scope: str) -> None:
    import importlib
    importlib.import_module(f'{scope}.utils').register_all_modules(init_default_scope=False)


def _no_pretrained(node: Any) -> None:
    """Drop every ``Pretrained`` init_cfg (nothing is downloaded and the weights do not change the cost)."""
    if isinstance(node, dict):
        init = node.get('init_cfg')
        if isinstance(init, dict) and init.get('type') == 'Pretrained' or \
                isinstance(init, list) and any(i.get('type') == 'Pretrained' for i in init):
            node['init_cfg'] = None
        for value in node.values():
            _no_pretrained(value)
    elif isinstance(node, (list, tuple)):
        for value in node:
            _no_pretrained(value)


def _single_process_norms(node: Any) -> None:
    """SyncBN -> BN: one process has nothing to synchronise with, and the cost per device is the same."""
    if isinstance(node, dict):
        if node.get('type') in ('SyncBN', 'MMSyncBN'):
            node['type'] = 'BN'
        for value in node.values():
            _single_process_norms(value)
    elif isinstance(node, (list, tuple)):
        for value in node:
            _single_process_norms(value)


@dataclass
class Resolved:
    """A spec turned into a config: ``cfg`` is the backbone dict (``is_backbone``) or the model dict; ``scope``
    the default scope to build it in; ``optim`` the config's ``optim_wrapper`` (or None)."""
    cfg: dict
    is_backbone: bool
    scope: Optional[str]
    optim: Optional[dict]


def resolve(spec: ModelSpec, with_cp: Optional[bool] = None,
            shape: Optional[Tuple[int, int]] = None) -> Resolved:
    """The config dict of ``spec`` with ``arch``, ``options`` and ``with_cp`` applied and pretraining off.

    A fixed input size of a config's data preprocessor (mmseg pads every crop to ``size``) becomes ``shape``, so
    the model sees the requested resolution."""
    import mmvisatt.models  # noqa: F401  (registers the backbones)
    optim, scope, is_backbone = None, None, True
    if spec.is_config:
        if not osp.isfile(spec.source):
            raise BenchmarkError(f"Config file '{spec.source}' does not exist.")
        cfg = Config.fromfile(spec.source)
        if spec.cfg_options:
            cfg.merge_from_dict(spec.cfg_options)
        if 'model' not in cfg:
            raise BenchmarkError(f'{spec.source} has no `model` to benchmark.')
        scope = cfg.get('default_scope')
        if scope in TASK_SCOPES:
            _import_scope(scope)
        model = cfg.model.to_dict()
        # as mmengine's Runner does: a top-level data_preprocessor (mmpretrain's, with num_classes) is the model's
        if cfg.get('data_preprocessor') is not None:
            model.setdefault('data_preprocessor', cfg.data_preprocessor.to_dict())
        preprocessor = model.get('data_preprocessor') or {}
        if shape is not None and preprocessor.get('size') is not None:
            preprocessor['size'] = tuple(shape)
        optim = cfg.get('optim_wrapper')
        optim = optim.to_dict() if isinstance(optim, ConfigDict) else optim
        if spec.backbone_only:
            if 'backbone' not in model:
                raise BenchmarkError(f'{spec.source} has no model.backbone; drop --backbone-only.')
            model, optim = model['backbone'], None
        else:
            is_backbone = False
    elif spec.source.startswith(TIMM_PREFIX):
        model = _timm_backbone(spec, shape)
    elif spec.source in backbone_presets(spec.config_dir):
        preset = Config.fromfile(osp.join(spec.config_dir, '_base_', 'backbones', f'{spec.source}.py'))
        if 'preset' not in preset or 'backbone' not in preset.preset:
            raise BenchmarkError(f'Preset file {spec.source}.py has no preset.backbone.')
        model = preset.preset.backbone.to_dict()
    elif _registry_has(spec.source):
        model = dict(type=spec.source)
    else:
        presets = ', '.join(backbone_presets(spec.config_dir)) or 'none found'
        raise BenchmarkError(
            f"Unknown backbone '{spec.source}': it is not a model type in the registry (mmvisatt types such as "
            f"RMT, ShuntedTransformer, FAN, ReSwinTransformer; other libraries with their scope, e.g. "
            f"mmdet.SwinTransformer), not a timm model (timm.NAME, e.g. timm.mvitv2_tiny), not a backbone preset "
            f"({presets}) and not a config file (*.py).")
    backbone = model if is_backbone else model.get('backbone')
    if backbone is None:
        if spec.arch is not None or spec.options or with_cp is not None:
            raise BenchmarkError(f'{spec.source} has no model.backbone for --arch / --backbone-options / '
                                 '--with-cp; drop them.')
        backbone = {}
    if spec.arch is not None:
        backbone['arch'] = spec.arch
    backbone.update(spec.options)
    if with_cp is not None:
        backbone['with_cp'] = with_cp
    _no_pretrained(model)
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        _single_process_norms(model)
    return Resolved(model, is_backbone, scope, optim)


class TimmFeatures(nn.Module):
    """A timm model as a backbone of the benchmark, built for the input size it will see.

    ``features_only`` (default) returns timm's multi-scale features (``out_indices`` 0-3, strides 4-32; a plain
    ViT's last block), the counterpart of a dense backbone; False returns ``forward_features`` (the last stage,
    normalised). The input is zero-padded to a multiple of ``pad_to`` (32, as mmdet's data preprocessor pads a
    detector's batch), since timm's patch embeddings take no other sizes. MViTv2 sizes its relative-position tables
    for a square grid (it asserts a square ``img_size``) but reads the grid from the input, so the longer side gives
    its build size: the tables' extra rows are never read and the compute is that of the actual input.
    """

    def __init__(self, model_name: str, img_size: Tuple[int, int], features_only: bool = True, pad_to: int = 32,
                 with_cp: bool = False, **kwargs):
        super().__init__()
        import timm
        size = tuple(-(-int(s) // pad_to) * pad_to for s in img_size)
        if model_name.startswith('mvitv2'):
            size = (max(size), ) * 2
        # a plain ViT's features are its blocks' outputs: the last block (every block built) is what a dense head
        # reads (ViTDet), where blocks 0-3 would build a third of the network
        indices = (-1, ) if model_name.startswith(PLAIN_VITS) else (0, 1, 2, 3)
        extra = dict(features_only=True, out_indices=indices) if features_only else dict(num_classes=0)
        self.model = timm.create_model(model_name, pretrained=False, img_size=size, **extra, **kwargs)
        self.features_only = features_only
        self.pad_to = pad_to
        self.with_cp = with_cp
        if with_cp:
            self.model.set_grad_checkpointing(True)

    def forward(self, x: torch.Tensor):
        height, width = x.shape[-2:]
        x = F.pad(x, (0, -width % self.pad_to, 0, -height % self.pad_to))
        return tuple(self.model(x)) if self.features_only else self.model.forward_features(x)


def _timm_backbone(spec: ModelSpec, shape: Optional[Tuple[int, int]]) -> dict:
    """The config of a ``timm.NAME`` spec: a :class:`TimmFeatures` built for ``shape``."""
    import timm
    name = spec.source[len(TIMM_PREFIX):]
    if not timm.is_model(name):
        raise BenchmarkError(f"timm {timm.__version__} has no model '{name}'; name one of timm.list_models(), e.g. "
                             "timm.swin_tiny_patch4_window7_224 or timm.mvitv2_tiny.")
    if spec.arch is not None:
        raise BenchmarkError(f'{spec.source} is a timm model, whose name is its arch: drop the arch '
                             f'{spec.arch!r}.')
    return dict(type=TIMM_PREFIX, model_name=name, img_size=tuple(shape or (224, 224)))


@contextlib.contextmanager
def _quiet_logs():
    """Keep mmengine's per-parameter init and paramwise-lr INFO lines out of the benchmark's output."""
    from mmengine.logging import MMLogger
    loggers = [MMLogger.get_current_instance(), MMLogger.get_instance('mmengine')]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def build_model(resolved: Resolved, label: str) -> nn.Module:
    """Build and initialise ``resolved`` (randomly); errors from the constructor name the model."""
    # task models read their sub-configs as attributes (train_cfg.rpn)
    cfg = ConfigDict(copy.deepcopy(resolved.cfg))
    try:
        if cfg.get('type') == TIMM_PREFIX:
            return TimmFeatures(**{k: v for k, v in resolved.cfg.items() if k != 'type'})
        with DefaultScope.overwrite_default_scope(resolved.scope):
            model = MODELS.build(cfg)
    except (TypeError, ValueError, KeyError, AssertionError) as error:
        hint = ''
        if "keyword argument 'with_cp'" in str(error):
            hint = ' This backbone has no activation checkpointing switch: drop --with-cp.'
        elif "keyword argument 'arch'" in str(error):
            hint = ' This model type takes no `arch`: drop --arch.'
        raise BenchmarkError(f'Cannot build {label}: {error}.{hint}') from None
    with _quiet_logs():
        model.init_weights()
    return model


def model_kind(model: nn.Module) -> str:
    """'det', 'seg' or 'cls' for a whole model of a task library, 'backbone' otherwise."""
    root = type(model).__module__.split('.')[0]
    if root == 'mmdet':
        from mmdet.models.detectors import BaseDetector
        if isinstance(model, BaseDetector):
            return 'det'
    if root == 'mmseg':
        from mmseg.models.segmentors import BaseSegmentor
        if isinstance(model, BaseSegmentor):
            return 'seg'
    if root == 'mmpretrain':
        from mmpretrain.models.classifiers import BaseClassifier
        if isinstance(model, BaseClassifier):
            return 'cls'
    return 'backbone'


def _num_classes(model: nn.Module, default: int) -> int:
    """The largest ``num_classes`` of the heads (an RPN head says 1, the box and mask heads the dataset's)."""
    values = [m.num_classes for m in model.modules() if isinstance(getattr(m, 'num_classes', None), int)]
    return max(values) if values and max(values) > 1 else default


# ----------------------------------------------------------------------------------------------------------------
# Synthetic batches


def _images(settings: BenchmarkSettings, generator: torch.Generator) -> List[torch.Tensor]:
    h, w = settings.shape
    return [torch.randint(0, 256, (3, h, w), generator=generator, dtype=torch.uint8)
            for _ in range(settings.batch_size)]


def det_batch(model: nn.Module, settings: BenchmarkSettings) -> dict:
    """Images with ``settings.boxes_per_image`` random boxes each (and masks when the detector has a mask head) as
    mmdet's loaders give them: masks are uint8 bitmaps (mmdet's test helper makes float64 ones, eight times the
    bytes)."""
    from mmdet.structures.mask import BitmapMasks
    from mmdet.testing import demo_mm_inputs
    h, w = settings.shape
    with_mask = bool(getattr(model, 'with_mask', False))
    batch = demo_mm_inputs(settings.batch_size, image_shapes=[(3, h, w)] * settings.batch_size,
                           num_items=[settings.boxes_per_image] * settings.batch_size,
                           num_classes=_num_classes(model, 80), with_mask=with_mask)
    if with_mask:
        for sample in batch['data_samples']:
            masks = sample.gt_instances.masks
            sample.gt_instances.masks = BitmapMasks(masks.masks.astype(np.uint8), masks.height, masks.width)
    return batch


def seg_batch(model: nn.Module, settings: BenchmarkSettings, generator: torch.Generator) -> dict:
    """Images with random label maps, as mmseg's loaders give them."""
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample
    h, w = settings.shape
    num_classes = _num_classes(model, 19)
    samples = []
    for _ in range(settings.batch_size):
        sample = SegDataSample(metainfo=dict(img_shape=(h, w), ori_shape=(h, w), pad_shape=(h, w),
                                             scale_factor=(1.0, 1.0), flip=False))
        labels = torch.randint(0, num_classes, (1, h, w), generator=generator)
        sample.gt_sem_seg = PixelData(data=labels)
        samples.append(sample)
    return dict(inputs=_images(settings, generator), data_samples=samples)


def cls_batch(model: nn.Module, settings: BenchmarkSettings, generator: torch.Generator) -> dict:
    """Images with random labels, as mmpretrain's loaders give them."""
    from mmpretrain.structures import DataSample
    num_classes = _num_classes(model, 1000)
    samples = [DataSample().set_gt_label(int(torch.randint(0, num_classes, (1, ), generator=generator)))
               for _ in range(settings.batch_size)]
    return dict(inputs=_images(settings, generator), data_samples=samples)


# ----------------------------------------------------------------------------------------------------------------
# One pass of inference or training


def _loss_of_outputs(outputs: Any) -> torch.Tensor:
    """A scalar that depends on every output of a backbone (tensor, tuple/list or dict of tensors)."""
    if isinstance(outputs, torch.Tensor):
        return outputs.float().mean()
    if isinstance(outputs, dict):
        outputs = list(outputs.values())
    if isinstance(outputs, (list, tuple)) and outputs:
        return sum(_loss_of_outputs(o) for o in outputs)
    raise BenchmarkError(f'Cannot train on backbone outputs of type {type(outputs).__name__}.')


def _build_optimizer(model: nn.Module, optim: Optional[dict]) -> Tuple[torch.optim.Optimizer, Optional[dict]]:
    """The config's optimizer (with its paramwise settings) or AdamW; and its gradient clipping."""
    if not optim:
        return torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05), None
    from mmengine.optim import build_optim_wrapper
    # the loss scaling of an AmpOptimWrapper is done here by --dtype, so build the plain wrapper
    cfg = {k: v for k, v in optim.items() if k not in ('loss_scale', 'dtype', 'use_fsdp')}
    cfg['type'] = 'OptimWrapper'
    with _quiet_logs():
        wrapper = build_optim_wrapper(model, cfg)
    return wrapper.optimizer, cfg.get('clip_grad')


class Workload:
    """A built model on its device with a synthetic batch; :meth:`infer` and :meth:`train_step` run one pass.

    Weights stay float32; ``bf16`` / ``fp16`` run the passes under autocast.
    """

    def __init__(self, spec: ModelSpec, settings: BenchmarkSettings):
        self.spec, self.settings = spec, settings
        resolved = resolve(spec, settings.with_cp, settings.shape)
        torch.manual_seed(settings.seed)
        self.model = build_model(resolved, spec.label).to(settings.device)
        self.kind = 'backbone' if resolved.is_backbone else model_kind(self.model)
        if self.kind == 'backbone' and not resolved.is_backbone:
            raise BenchmarkError(f'{spec.label}: no synthetic batch is known for a {type(self.model).__name__}; '
                                 'benchmark its backbone with --backbone-only.')
        self.backbone = self.model if self.kind == 'backbone' else getattr(self.model, 'backbone', None)
        generator = torch.Generator().manual_seed(settings.seed)
        if self.kind == 'backbone':
            channels = getattr(self.model, 'in_channels', 3)
            channels = channels if isinstance(channels, int) else 3
            self.batch = torch.randn(settings.batch_size, channels, *settings.shape, generator=generator)
            self.batch = self.batch.to(settings.device)
        elif self.kind == 'det':
            self.batch = det_batch(self.model, settings)
        elif self.kind == 'seg':
            self.batch = seg_batch(self.model, settings, generator)
        else:
            self.batch = cls_batch(self.model, settings, generator)
        self.optimizer, self.clip_grad = _build_optimizer(self.model, resolved.optim)
        self.scaler = torch.amp.GradScaler(self.device_type) if settings.dtype == 'fp16' else None

    @property
    def device_type(self) -> str:
        return torch.device(self.settings.device).type

    def autocast(self):
        if self.settings.dtype == 'float32':
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=DTYPES[self.settings.dtype])

    @property
    def with_cp(self) -> Optional[bool]:
        """Whether the backbone checkpoints activations (families keep the switch on the backbone or its stages);
        None when it has no such switch."""
        if self.backbone is None:
            return None
        values = [bool(m.with_cp) for m in self.backbone.modules() if hasattr(m, 'with_cp')]
        return any(values) if values else None

    def parameters(self) -> Dict[str, int]:
        counts = {'total': sum(p.numel() for p in self.model.parameters())}
        if self.backbone is not None and self.backbone is not self.model:
            counts['backbone'] = sum(p.numel() for p in self.backbone.parameters())
        return counts

    def describe(self) -> dict:
        """What was built: kind, class names, whether the backbone checkpoints, parameter counts."""
        return dict(kind=self.kind, type=type(self.model).__name__,
                    backbone=type(self.backbone).__name__ if self.backbone is not None else None,
                    with_cp=self.with_cp, params=self.parameters())

    def forward_flops(self) -> Optional[int]:
        """FLOPs (2 per multiply-add) of one inference forward of the batch, counted by the model zoo's counter
        (matrix products, attention and convolutions) on a copy on the meta device, which does no arithmetic;
        None for a whole task model, whose heads' cost depends on its proposals."""
        if self.kind != 'backbone':
            return None
        from mmvisatt.analysis.model_zoo import count_multiply_adds
        model = copy.deepcopy(self.model).to('meta').eval()
        x = torch.empty(self.batch.shape, device='meta')
        return 2 * count_multiply_adds(lambda: model(x))

    def infer(self) -> Any:
        self.model.eval()
        with torch.no_grad(), self.autocast():
            if self.kind == 'backbone':
                return self.model(self.batch)
            return self.model.test_step(self.batch)

    def train_step(self) -> torch.Tensor:
        self.model.train()
        with self.autocast():
            if self.kind == 'backbone':
                loss = _loss_of_outputs(self.model(self.batch))
            else:
                data = self.model.data_preprocessor(self.batch, True)
                loss, _ = self.model.parse_losses(self.model(**data, mode='loss'))
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            if self.clip_grad:
                self.scaler.unscale_(self.optimizer)
                self._clip()
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            loss.backward()
            if self.clip_grad:
                self._clip()
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    def _clip(self) -> None:
        """Gradient clipping as mmengine's OptimWrapper reads ``clip_grad`` (type 'norm', the default, or 'value')."""
        kwargs = dict(self.clip_grad)
        clip = nn.utils.clip_grad_value_ if kwargs.pop('type', 'norm') == 'value' else nn.utils.clip_grad_norm_
        clip([p for p in self.model.parameters() if p.grad is not None], **kwargs)

    def run(self, mode: str) -> Any:
        """One pass of ``mode`` ('inference' or 'train'); a dtype the model cannot run becomes a clear error."""
        try:
            return self.infer() if mode == 'inference' else self.train_step()
        except RuntimeError as error:
            if self.settings.dtype != 'float32' and any(s in str(error) for s in ('Half', 'BFloat16', 'dtype')):
                raise BenchmarkError(f'{self.spec.label} cannot run {mode} in {self.settings.dtype} on '
                                     f'{self.settings.device}: {error}. Use --dtype float32.') from None
            raise


# ----------------------------------------------------------------------------------------------------------------
# Timing


def summarize(times_ms: Sequence[float]) -> Dict[str, float]:
    """Median, quartiles (inclusive method), interquartile range, mean, standard deviation, min and max."""
    values = sorted(float(t) for t in times_ms)
    if len(values) == 1:
        q1 = q3 = values[0]
    else:
        q1, _, q3 = statistics.quantiles(values, n=4, method='inclusive')
    return dict(median=statistics.median(values), q1=q1, q3=q3, iqr=q3 - q1, mean=statistics.fmean(values),
                std=statistics.stdev(values) if len(values) > 1 else 0.0, min=values[0], max=values[-1],
                n=len(values))


def cpu_usage() -> Optional[Tuple[float, float, int]]:
    """(user seconds, system seconds, minor page faults) of this process so far, or None where the OS has no
    ``getrusage`` (Windows)."""
    try:
        import resource
    except ImportError:
        return None
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime, usage.ru_stime, usage.ru_minflt


def cpu_split(usages: Sequence[Sequence[float]]) -> Dict[str, Dict[str, float]]:
    """Per-pass (user s, system s, minor faults) differences -> summaries of user_ms, system_ms, minor_faults."""
    return dict(user_ms=summarize([u[0] * 1e3 for u in usages]), system_ms=summarize([u[1] * 1e3 for u in usages]),
                minor_faults=summarize([u[2] for u in usages]))


def time_pass(run: Callable[[], Any], clock: Callable[[], float],
              split: bool) -> Tuple[float, Optional[List[float]], Any]:
    """Call ``run()`` once: (seconds by ``clock``, the (user s, system s, minor faults) it took when ``split`` else
    None, what it returned)."""
    before = cpu_usage() if split else None
    start = clock()
    result = run()
    elapsed = clock() - start
    usage = [end - begin for begin, end in zip(before, cpu_usage())] if split else None
    return elapsed, usage, result


def time_pass_cuda(run: Callable[[], Any], device: str) -> Tuple[float, Any]:
    """Call ``run()`` once between two CUDA events on ``device``'s current stream: (milliseconds of GPU time
    between them, what it returned). The host does not wait for the GPU inside the pass, as in training."""
    with torch.cuda.device(device):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        result = run()
        end.record()
        end.synchronize()
        return start.elapsed_time(end), result


def pass_ms(run: Callable[[], Any], device: str) -> float:
    """Milliseconds of one call of ``run()``: by CUDA events on a CUDA device (:func:`time_pass_cuda`), by the wall
    clock elsewhere."""
    if torch.device(device).type == 'cuda':
        return time_pass_cuda(run, device)[0]
    return time_pass(run, time.perf_counter, False)[0] * 1e3


def time_passes(workload: Workload, mode: str) -> dict:
    """``warmup`` untimed then ``repeats`` timed passes of ``mode``; times in ms and throughput in images/s.

    On CUDA each pass is timed by CUDA events (``timing: 'cuda events'``); on the CPU by ``clock``."""
    settings = workload.settings
    for _ in range(settings.warmup):
        workload.run(mode)
    cuda = torch.device(settings.device).type == 'cuda'
    split = not cuda and settings.clock == 'cpu' and cpu_usage() is not None
    times, usages = [], []
    if cuda:
        torch.cuda.synchronize(settings.device)
    for _ in range(settings.repeats):
        if cuda:
            elapsed_ms, _ = time_pass_cuda(lambda: workload.run(mode), settings.device)
        else:
            elapsed, usage, _ = time_pass(lambda: workload.run(mode), CLOCKS[settings.clock], split)
            elapsed_ms = elapsed * 1e3
            if split:
                usages.append(usage)
        times.append(elapsed_ms)
    stats = summarize(times)
    result = dict(time_ms=stats, throughput=settings.batch_size / (stats['median'] / 1e3),
                  times_ms=[round(t, 3) for t in times],
                  timing='cuda events' if cuda else {'wall': 'perf_counter', 'cpu': 'process_time'}[settings.clock])
    if split:
        result['cpu_split'] = cpu_split(usages)
    return result


def matmul_peak_tflops(settings: BenchmarkSettings, size: Optional[int] = None, repeats: int = 10) -> dict:
    """The rate of the work these models are made of, on the benchmark's device and dtype, in the same process: a
    square matrix product of ``size`` (8192 on CUDA, 512 on the CPU) in the dtype autocast gives a linear layer
    (float32 keeps torch's TF32 setting), median of ``repeats`` after three untimed ones, timed like the passes."""
    device = settings.device
    cuda = torch.device(device).type == 'cuda'
    n = size or (8192 if cuda else 512)
    generator = torch.Generator(device=device).manual_seed(settings.seed)
    a, b = (torch.randn(n, n, generator=generator, device=device).to(DTYPES[settings.dtype]) for _ in range(2))
    for _ in range(3):
        a @ b
    if cuda:
        torch.cuda.synchronize(device)
    median = statistics.median(pass_ms(lambda: a @ b, device) for _ in range(repeats))
    return dict(matmul_measured=2 * n ** 3 / (median / 1e3) / 1e12, matmul_size=n, dtype=settings.dtype,
                matmul_ms=median)


def add_flop_rates(result: dict, flops: int, peak_tflops: Optional[float]) -> None:
    """Achieved TFLOP/s of each timed mode (a training step counted as three forwards: the forward, and the
    backward's two products per forward product), and its share of ``peak_tflops``."""
    result['flops'] = dict(forward_gflop=flops / 1e9, train_gflop=3 * flops / 1e9,
                           convention='2 FLOPs per multiply-add; a training step = 3 forwards')
    for mode, factor in (('inference', 1), ('train', 3)):
        if mode in result:
            achieved = factor * flops / (result[mode]['time_ms']['median'] / 1e3) / 1e12
            result[mode]['achieved_tflops'] = achieved
            if peak_tflops:
                result[mode]['peak_share'] = achieved / peak_tflops


# ----------------------------------------------------------------------------------------------------------------
# Peak memory


def _proc_status_kib(field_name: str) -> int:
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith(field_name + ':'):
                return int(line.split()[1])
    raise BenchmarkError(f'/proc/self/status has no {field_name}; CPU peak memory needs Linux.')


def _reset_rss_peak() -> bool:
    """Set VmHWM to the current RSS (Linux >= 4.0); False where the kernel does not allow it."""
    try:
        with open('/proc/self/clear_refs', 'w') as f:
            f.write('5')
        return True
    except OSError:
        return False


def _cuda_peak(workload: Workload, mode: str) -> dict:
    device = workload.settings.device
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    baseline = torch.cuda.memory_allocated(device)
    for _ in range(workload.settings.memory_steps):
        workload.run(mode)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    return dict(method='cuda max_memory_allocated', peak_mib=peak / _MIB, baseline_mib=baseline / _MIB,
                step_peak_mib=(peak - baseline) / _MIB,
                reserved_peak_mib=torch.cuda.max_memory_reserved(device) / _MIB, steps=workload.settings.memory_steps)


def _rss_peak(workload: Workload, mode: str) -> dict:
    gc.collect()
    baseline = _proc_status_kib('VmRSS')
    reset = _reset_rss_peak()
    for _ in range(workload.settings.memory_steps):
        workload.run(mode)
    peak = _proc_status_kib('VmHWM')
    return dict(method='process RSS high-water mark (VmHWM), fresh subprocess', peak_mib=peak / 1024,
                baseline_mib=baseline / 1024, step_peak_mib=(peak - baseline) / 1024, hwm_reset=reset,
                steps=workload.settings.memory_steps, model=workload.describe())


def memory_worker() -> None:
    """Entry point of the CPU memory subprocess: reads {spec, settings, mode} as JSON on stdin, prints the
    result after :data:`_RESULT_MARK`."""
    request = json.loads(sys.stdin.read())
    settings = BenchmarkSettings(**request['settings'])
    settings.apply()
    try:
        workload = Workload(ModelSpec(**request['spec']), settings)
        result = _rss_peak(workload, request['mode'])
    except BenchmarkError as error:
        result = dict(error=str(error))
    print(_RESULT_MARK + json.dumps(result), flush=True)


def measure_memory(spec: ModelSpec, settings: BenchmarkSettings, mode: str,
                   workload: Optional[Workload] = None) -> dict:
    """Peak memory of ``memory_steps`` passes of ``mode``: in this process on CUDA (reusing ``workload``), in a
    fresh subprocess on CPU."""
    if torch.device(settings.device).type == 'cuda':
        return _cuda_peak(workload or Workload(spec, settings), mode)
    if not osp.exists('/proc/self/status'):
        raise BenchmarkError('CPU peak memory is read from /proc/self/status, which needs Linux; drop the '
                             'memory measurements (--measure inference train).')
    env = dict(os.environ)
    if env.pop(_ALLOCATOR_MARK, None):
        # the RSS method below needs glibc returning freed blocks, whatever allocator the timings used
        for var in _ALLOCATOR_VARS:
            env.pop(var, None)
    # a fixed threshold (it also stops glibc from raising it dynamically) makes freed large blocks leave the RSS
    env.setdefault('MALLOC_MMAP_THRESHOLD_', '65536')
    package_root = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
    env['PYTHONPATH'] = os.pathsep.join(p for p in (package_root, env.get('PYTHONPATH')) if p)
    if settings.threads:
        env['OMP_NUM_THREADS'] = str(settings.threads)
    request = json.dumps(dict(spec=asdict(spec), settings=asdict(settings), mode=mode))
    here = osp.dirname(osp.abspath(__file__))
    proc = subprocess.run([sys.executable, '-c', f'import sys; sys.path.insert(0, {here!r}); '
                           'from benchmark import memory_worker; memory_worker()'],
                          input=request, capture_output=True, text=True, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(_RESULT_MARK)]
    if proc.returncode != 0 or not lines:
        tail = '\n'.join(proc.stderr.strip().splitlines()[-15:])
        killed = ' (killed by a signal: out of memory? try a smaller --shape or --batch-size, or --with-cp)' \
            if proc.returncode < 0 else ''
        raise RuntimeError(f'The memory subprocess for {spec.label} ({mode}) failed with exit code '
                           f'{proc.returncode}{killed}:\n{tail}')
    result = json.loads(lines[-1][len(_RESULT_MARK):])
    if 'error' in result:
        raise BenchmarkError(result['error'])
    return result


# ----------------------------------------------------------------------------------------------------------------
# The whole benchmark


def machine_info(settings: BenchmarkSettings) -> dict:
    """Where the numbers come from."""
    info = dict(platform=platform.platform(), python=platform.python_version(), torch=torch.__version__,
                device=settings.device, logical_cpus=os.cpu_count(), torch_threads=torch.get_num_threads())
    try:
        with open('/proc/cpuinfo') as f:
            names = [line.split(':', 1)[1].strip() for line in f if line.startswith('model name')]
        info['cpu'] = names[0] if names else platform.processor()
        info['memory_gib'] = round(_meminfo_kib('MemTotal') / 2 ** 20, 1)
    except OSError:
        info['cpu'] = platform.processor()
    if torch.device(settings.device).type == 'cuda':
        info['gpu'] = torch.cuda.get_device_name(settings.device)
    return info


def _meminfo_kib(name: str) -> int:
    with open('/proc/meminfo') as f:
        for line in f:
            if line.startswith(name + ':'):
                return int(line.split()[1])
    return 0


def benchmark_model(spec: ModelSpec, settings: BenchmarkSettings, measure: Sequence[str] = MEASUREMENTS,
                    peak_tflops: Optional[float] = None) -> dict:
    """Every measurement of ``measure`` for one model; see the module docstring for what each one is. A timed
    backbone also gets its FLOPs and the achieved TFLOP/s (as a share of ``peak_tflops`` when given)."""
    unknown = set(measure) - set(MEASUREMENTS)
    if unknown:
        raise BenchmarkError(f'Unknown measurement(s) {sorted(unknown)}; choose from {list(MEASUREMENTS)}.')
    result = dict(name=spec.label, spec=asdict(spec))
    timed = [mode for mode in ('inference', 'train') if mode in measure]
    # on CPU the memory runs in subprocesses, so memory alone needs no model in this process
    workload = None
    if timed or torch.device(settings.device).type == 'cuda':
        workload = Workload(spec, settings)
        result.update(workload.describe())
    for mode in timed:
        result[mode] = time_passes(workload, mode)
    flops = workload.forward_flops() if timed else None
    if flops:
        add_flop_rates(result, flops, peak_tflops)
    memory = {}
    for mode in ('inference', 'train'):
        if f'{mode}-memory' in measure:
            memory[mode] = measure_memory(spec, settings, mode, workload)
            for key, value in memory[mode].pop('model', {}).items():
                result.setdefault(key, value)
    if memory:
        result['memory'] = memory
    del workload
    gc.collect()
    return result


# (table label, path into a model result)
METRICS: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ('params (M)', ('params', 'total')),
    ('inference latency (ms, median)', ('inference', 'time_ms', 'median')),
    ('inference throughput (img/s)', ('inference', 'throughput')),
    ('inference user time (ms, median)', ('inference', 'cpu_split', 'user_ms', 'median')),
    ('inference system time (ms, median)', ('inference', 'cpu_split', 'system_ms', 'median')),
    ('train step (ms, median)', ('train', 'time_ms', 'median')),
    ('train throughput (img/s)', ('train', 'throughput')),
    ('train user time (ms, median)', ('train', 'cpu_split', 'user_ms', 'median')),
    ('train system time (ms, median)', ('train', 'cpu_split', 'system_ms', 'median')),
    ('forward GFLOP', ('flops', 'forward_gflop')),
    ('inference TFLOP/s', ('inference', 'achieved_tflops')),
    ('train TFLOP/s', ('train', 'achieved_tflops')),
    ('train share of peak', ('train', 'peak_share')),
    ('inference peak (MiB)', ('memory', 'inference', 'peak_mib')),
    ('inference step peak (MiB)', ('memory', 'inference', 'step_peak_mib')),
    ('train peak (MiB)', ('memory', 'train', 'peak_mib')),
    ('train step peak (MiB)', ('memory', 'train', 'step_peak_mib')),
)


def _get(result: dict, path: Sequence[str]) -> Optional[float]:
    node: Any = result
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def compare_results(first: dict, second: dict) -> Dict[str, float]:
    """second / first for every metric both results have (e.g. 1.3 = the second takes 30% more)."""
    ratios = {}
    for label, path in METRICS:
        a, b = _get(first, path), _get(second, path)
        if a is not None and b is not None and a != 0:
            ratios['.'.join(path)] = b / a
    return ratios


def model_line(result: dict) -> str:
    """One line of a model's main numbers, logged as each model ends so that a run stopped early keeps them."""
    cells = [('inference', ('inference', 'time_ms', 'median'), 'ms'), ('train', ('train', 'time_ms', 'median'), 'ms'),
             ('train peak', ('memory', 'train', 'peak_mib'), 'MiB'),
             ('train', ('train', 'achieved_tflops'), 'TFLOP/s')]
    parts = [f'{name} {value:.4g} {unit}' for name, path, unit in cells if (value := _get(result, path)) is not None]
    return f"{result.get('name', '?')}: " + ', '.join(parts)


def run_benchmark(specs: Sequence[ModelSpec], settings: BenchmarkSettings,
                  measure: Sequence[str] = MEASUREMENTS, log: Optional[Callable[[str], None]] = None,
                  peak_tflops: Optional[float] = None,
                  on_model: Optional[Callable[[dict], None]] = None) -> dict:
    """Benchmark one model or several side by side in this process (each later one gets ``ratios`` to the first;
    with two, the report's ``ratios`` are second / first). Timed runs measure the device's matrix-product rate
    first (``peak_tflops``: its measurement, and ``given``, the value passed here, which the shares then use).
    ``on_model`` gets the report so far after each model. Returns the JSON-ready report."""
    if not specs:
        raise BenchmarkError('Name a model to benchmark.')
    settings.apply()
    report = dict(tool='mmvisatt benchmark', date=time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime()),
                  machine=machine_info(settings), settings=asdict(settings), measure=list(measure), models=[],
                  allocator=current_allocator())
    if {'inference', 'train'} & set(measure):
        report['peak_tflops'] = dict(matmul_peak_tflops(settings), given=peak_tflops)
        peak_tflops = peak_tflops or report['peak_tflops']['matmul_measured']
    for spec in specs:
        if log:
            log(f'benchmarking {spec.label} ...')
        result = benchmark_model(spec, settings, measure, peak_tflops)
        if report['models']:
            result['ratios'] = compare_results(report['models'][0], result)
        report['models'].append(result)
        if log:
            log(model_line(result))
        if on_model:
            on_model(report)
    if len(specs) == 2:
        report['ratios'] = report['models'][1]['ratios']
    return report


def _cell(result: dict, path: Sequence[str]) -> str:
    value = _get(result, path)
    if value is None:
        return '-'
    if path[0] == 'params':
        return f'{value / 1e6:.2f}'
    if path[-1] == 'peak_share':
        return f'{100 * value:.1f}%'
    if path[-1] in ('achieved_tflops', 'forward_gflop'):
        return f'{value:.3g}'
    if path[-1] == 'median':
        iqr = _get(result, list(path[:-1]) + ['iqr'])
        return f'{value:.1f} ± {iqr / 2:.1f}'
    return f'{value:.1f}'


def format_report(report: dict) -> str:
    """A readable table: one row per metric, one column per model, and the ratio column when comparing.
    Medians come with half the interquartile range."""
    models = report['models']
    names = [m['name'] + (' +cp' if m.get('with_cp') else '') for m in models]
    header = ['metric'] + names + (['ratio 2/1'] if len(models) == 2 else [])
    rows = []
    for label, path in METRICS:
        cells = [_cell(m, path) for m in models]
        if all(c == '-' for c in cells):
            continue
        if len(models) == 2:
            ratio = report.get('ratios', {}).get('.'.join(path))
            cells.append('-' if ratio is None else f'{ratio:.2f}x')
        rows.append([label] + cells)
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    s = report['settings']
    title = (f"{s['batch_size']} x {s['shape'][0]}x{s['shape'][1]}, {s['dtype']}, {s['device']}, "
             f"{report['machine']['torch_threads']} threads")
    if {'inference', 'train'} & set(report['measure']):
        title += f", warm-up {s['warmup']}, {s['repeats']} timed repeats"
        if s.get('clock') == 'cpu':
            title += ' (CPU time)'
        if report.get('allocator', 'default') != 'default':
            title += f", allocator {report['allocator']}"
    if {'inference-memory', 'train-memory'} & set(report['measure']):
        title += f", peak memory of {s['memory_steps']} passes"
    peak = report.get('peak_tflops')
    if peak:
        title += f"; peak {peak['given'] or peak['matmul_measured']:.3g} TFLOP/s (" + (
            'given' if peak['given'] else f"{peak['matmul_size']}^3 {peak['dtype']} matmul") + ')'
    lines = [title,
             '  '.join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(header, widths))),
             '  '.join('-' * w for w in widths)]
    for row in rows:
        lines.append('  '.join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
    return '\n'.join(lines)


# ----------------------------------------------------------------------------------------------------------------
# Targets of a suite, and the Markdown table

_SWIN_T, _MVIT_T = 'timm.swin_tiny_patch4_window7_224', 'timm.mvitv2_tiny'
# suite -> (label, model, anchor, kind, bound): 'step' targets bound model's train step / the anchor's; 'rate'
# targets bound model's achieved train TFLOP/s / the anchor's from below
SUITE_TARGETS = {
    't-presets': [('ReSwin-T train step / timm Swin-T', 'reswin_t', _SWIN_T, 'step', 1.15),
                  ('ReMViTv2-T train step / timm MViTv2-T', 'remvit_t', _MVIT_T, 'step', 1.15)] + [
        (f'{name} train TFLOP/s / timm Swin-T', name, _SWIN_T, 'rate', 0.70)
        for name in ('revit_b', 'rmt_t', 'evt_t', 'evt_swin_t', 'fan_vit_t', 'fan_hybrid_t', 'fan_swin_t',
                     'shunted_t')],
}


def evaluate_targets(report: dict, targets: Sequence[tuple]) -> List[dict]:
    """Each target of ``targets`` (see :data:`SUITE_TARGETS`) against the report's models: the measured ratio and
    whether it is met; a target whose models or times are missing from the report is left out."""
    by_name = {m['name']: m for m in report['models']}
    rows = []
    for label, name, anchor, kind, bound in targets:
        path = ('train', 'time_ms', 'median') if kind == 'step' else ('train', 'achieved_tflops')
        if name not in by_name or anchor not in by_name:
            continue
        value, reference = _get(by_name[name], path), _get(by_name[anchor], path)
        if value is None or not reference:
            continue
        ratio = value / reference
        rows.append(dict(target=label, model=name, anchor=anchor, ratio=ratio, bound=bound,
                         met=ratio <= bound if kind == 'step' else ratio >= bound,
                         relation='<=' if kind == 'step' else '>='))
    return rows


def _md(value: Optional[float], spec: str = ',.1f') -> str:
    return '-' if value is None else format(value, spec)


def markdown_report(report: dict) -> str:
    """The report as a Markdown table for docs/benchmarks.md: the setting and device, one row per model, and the
    targets with what was measured."""
    s, machine = report['settings'], report['machine']
    device = machine.get('gpu') or machine.get('cpu')
    lines = [f"{device}, torch {machine['torch']}, {s['dtype']}, {s['batch_size']} x {s['shape'][0]}x{s['shape'][1]}, "
             f"warm-up {s['warmup']}, median of {s['repeats']} passes timed by "
             f"{_get(report['models'][0], ('train', 'timing')) or _get(report['models'][0], ('inference', 'timing'))}"
             f", {report['date']}."]
    peak = report.get('peak_tflops')
    if peak:
        lines[0] += (f" Peak: {peak['matmul_size']}^3 {peak['dtype']} matmul {peak['matmul_measured']:.3g} TFLOP/s"
                     + (f", shares of the given {peak['given']:.3g}" if peak['given'] else '') + '.')
    lines += ['', '| model | params (M) | forward GFLOP | inference (ms) | train step (ms) | train peak (MiB) | '
              'train TFLOP/s | share of peak |', '|---|---|---|---|---|---|---|---|']
    for m in report['models']:
        params = _get(m, ('params', 'total'))
        share = _get(m, ('train', 'peak_share'))
        lines.append(f"| `{m['name']}` | {_md(params and params / 1e6, '.2f')} "
                     f"| {_md(_get(m, ('flops', 'forward_gflop')), '.3g')} "
                     f"| {_md(_get(m, ('inference', 'time_ms', 'median')), ',.2f')} "
                     f"| {_md(_get(m, ('train', 'time_ms', 'median')), ',.2f')} "
                     f"| {_md(_get(m, ('memory', 'train', 'peak_mib')), ',.0f')} "
                     f"| {_md(_get(m, ('train', 'achieved_tflops')), '.3g')} | {_md(share, '.1%')} |")
    if report.get('targets'):
        lines += ['', '| target | measured | bound | met |', '|---|---|---|---|']
        for t in report['targets']:
            lines.append(f"| {t['target']} | {t['ratio']:.2f} | {t['relation']} {t['bound']:.2f} | "
                         f"{'yes' if t['met'] else '**no**'} |")
    return '\n'.join(lines) + '\n'


# ----------------------------------------------------------------------------------------------------------------
# Command line (tools/analysis/benchmark.py)

CLI_EXAMPLES = """examples:
  python tools/analysis/benchmark.py --backbone RMT --arch t --shape 800 1216
  python tools/analysis/benchmark.py --backbone reswin_t --compare mmdet.SwinTransformer --dtype bf16
  python tools/analysis/benchmark.py configs/mask_rcnn_reswin_t_1x.py --shape 800 1216 --batch-size 2 \\
      --measure train-memory --with-cp --out work_dirs/bench.json
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description='Inference latency / throughput, training step time and peak memory of a backbone or a whole '
        'config on a synthetic batch; optionally side by side with a second model (ratios second / first).',
        epilog=CLI_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('config', nargs='?', help='config file: its whole model is benchmarked (or only '
                        'model.backbone with --backbone-only); give either this or --backbone')
    parser.add_argument('--backbone', help="backbone type (RMT, ShuntedTransformer, FAN, mmdet.SwinTransformer) or "
                        "preset of configs/_base_/backbones (reswin_t)")
    parser.add_argument('--arch', help="arch of the backbone: a preset name (t, s, hybrid_t) or a Python dict "
                        "literal, e.g. \"{'embed_dims': 32, 'depths': (1, 1, 1, 1), ...}\"")
    parser.add_argument('--backbone-only', action='store_true', help='benchmark only model.backbone of CONFIG')
    parser.add_argument('--backbone-options', nargs='+', action=DictAction, default={}, metavar='KEY=VALUE',
                        help='override backbone arguments (both models), e.g. drop_path_rate=0.2')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, default={}, metavar='KEY=VALUE',
                        help='override settings of CONFIG (and of a compared config)')
    parser.add_argument('--suite', choices=sorted(SUITES),
                        help='a set of models side by side, with its targets: t-presets = every form\'s T-size '
                        'preset, timm Swin-T and timm MViTv2-T (' + ', '.join(SUITES['t-presets']) + ')')
    parser.add_argument('--compare', metavar='SPEC', nargs='+',
                        help="more models, benchmarked in the same process (ratios to the first): 'Type[:arch]' "
                        "(mmdet.SwinTransformer, RMT:s), a preset (reswin_t), a timm model (timm.mvitv2_tiny: "
                        "its multi-scale features) or a config file")
    parser.add_argument('--shape', type=int, nargs='+', default=[224], metavar='N',
                        help='input height and width (one number for a square input; default 224)')
    parser.add_argument('--batch-size', type=int, default=1)
    parser.add_argument('--dtype', default='float32', choices=sorted(DTYPES) + sorted(DTYPE_ALIASES),
                        help='float32, or autocast mixed precision bf16 / fp16 (weights stay float32)')
    parser.add_argument('--device', default='cpu', help='cpu or cuda[:N]')
    parser.add_argument('--with-cp', action=argparse.BooleanOptionalAction, default=None,
                        help="activation checkpointing of the backbone on (--with-cp) or off (--no-with-cp); "
                        "default: the model's own setting")
    parser.add_argument('--measure', nargs='+', choices=MEASUREMENTS, default=list(MEASUREMENTS),
                        help='what to measure (default: all)')
    parser.add_argument('--warmup', type=int, default=3, help='untimed passes before timing (default 3)')
    parser.add_argument('--repeats', type=int, default=10, help='timed passes (default 10)')
    parser.add_argument('--memory-steps', type=int, default=2,
                        help='passes per memory measurement (default 2: the second training step holds the '
                        'optimizer state the first one creates)')
    parser.add_argument('--threads', type=int, help='torch CPU threads (default: OMP_NUM_THREADS / all cores)')
    parser.add_argument('--clock', choices=sorted(CLOCKS), default='wall',
                        help="time passes by elapsed time (wall, default) or by this process's CPU time (cpu: "
                        "leaves out waits for a core on a shared machine; sums the threads)")
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--score-chunk-numel', type=int, metavar='N',
                        help='row-chunk size (score elements) of the ReViT family\'s chunked score strategies, '
                             'for the whole process (default: the global setting, 2**26)')
    parser.add_argument('--allocator', choices=ALLOCATORS, default='default',
                        help='CPU memory allocator for the timed passes: jemalloc (preloaded, freed memory kept), '
                        'glibc-retain (glibc keeps freed memory) or default (the environment as it is); the command '
                        're-executes itself with it')
    parser.add_argument('--config-dir', default=CONFIG_DIR, help='where backbone presets are looked up')
    parser.add_argument('--peak-tflops', type=float,
                        help="the device's peak TFLOP/s for the shares of peak (e.g. a datasheet's dense bf16 "
                        "rate); default: a large matrix product's rate measured in the run")
    parser.add_argument('--out', metavar='FILE.json', help='write the report as JSON')
    parser.add_argument('--markdown', metavar='FILE.md', help='write the table (and a suite\'s targets) as Markdown')
    return parser


def allocator_environment(name: str) -> Dict[str, str]:
    """This process's environment with allocator ``name`` set up (see the module docstring)."""
    env = dict(os.environ)
    if name == 'jemalloc':
        library = next((path for path in JEMALLOC_LIBRARIES if osp.exists(path)), None)
        if library is None:
            raise BenchmarkError(f'--allocator jemalloc: no libjemalloc.so.2 in {", ".join(JEMALLOC_LIBRARIES)}; '
                                 f'install it (Debian/Ubuntu: apt-get install libjemalloc2) or use '
                                 f'--allocator glibc-retain')
        env['LD_PRELOAD'] = ' '.join(p for p in (library, env.get('LD_PRELOAD')) if p)
        env['MALLOC_CONF'] = 'dirty_decay_ms:-1,muzzy_decay_ms:-1'
    elif name == 'glibc-retain':
        env.update(GLIBC_RETAIN)
    elif name != 'default':
        raise BenchmarkError(f'unknown allocator {name!r}; choose one of {", ".join(ALLOCATORS)}')
    env[_ALLOCATOR_MARK] = name
    return env


def current_allocator() -> str:
    """The allocator this process was started with by :func:`apply_allocator` (``'default'`` otherwise)."""
    return os.environ.get(_ALLOCATOR_MARK, 'default')


def apply_allocator(name: str, from_command_line: bool) -> None:
    """Run under allocator ``name``: from the command line, re-execute ``sys.argv`` with it unless the process
    already runs under it (``default`` changes nothing); called with an argument list (from Python), a process
    started otherwise is an error, since the allocator must be in place before the process starts."""
    if not from_command_line:
        if name != current_allocator():
            raise BenchmarkError(f'--allocator {name} needs a process started with it: run the tool from the '
                                 f'command line')
        return
    if name == 'default' or current_allocator() == name:
        return
    env = allocator_environment(name)
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, *sys.argv], env)


def check_writable(option: str, path: str) -> None:
    """Refuse an output path that cannot be written before anything is measured: a folder where the file should be,
    or a file where one of its folders should be."""
    path = osp.abspath(path)
    if osp.isdir(path):
        raise BenchmarkError(f'{option} {path} is a folder; name a file in it, e.g. {osp.join(path, "bench.json")}.')
    folder = osp.dirname(path)
    while folder and not osp.exists(folder):
        folder = osp.dirname(folder)
    if folder and not osp.isdir(folder):
        raise BenchmarkError(f'{option} {path}: {folder} is a file, not a folder; pick another path for the report.')


def main(argv: Optional[Sequence[str]] = None) -> dict:
    """Parse the command line, benchmark, print the table and write ``--out``; returns the report."""
    args = build_parser().parse_args(argv)
    apply_allocator(args.allocator, from_command_line=argv is None)
    if sum(map(bool, (args.config, args.backbone, args.suite))) != 1:
        raise BenchmarkError('Give one of a CONFIG file, --backbone NAME or --suite NAME.')
    if args.backbone_only and not args.config:
        raise BenchmarkError('--backbone-only needs a CONFIG file.')
    if args.suite and args.arch:
        raise BenchmarkError('--suite names its models with their archs; drop --arch.')
    for option, path in (('--out', args.out), ('--markdown', args.markdown)):
        if path:
            check_writable(option, path)
    common = dict(options=dict(args.backbone_options), cfg_options=dict(args.cfg_options),
                  config_dir=args.config_dir)
    if args.config:
        specs = [ModelSpec(args.config, arch=parse_arch(args.arch), backbone_only=args.backbone_only, **common)]
    elif args.backbone:
        specs = [parse_spec(args.backbone, arch=parse_arch(args.arch), **common)]
    else:
        specs = [parse_spec(name, **common) for name in SUITES[args.suite]]
    specs += [parse_spec(spec, **common) for spec in args.compare or ()]
    shape = args.shape * 2 if len(args.shape) == 1 else args.shape
    settings = BenchmarkSettings(shape=tuple(shape), batch_size=args.batch_size, dtype=args.dtype,
                                 device=args.device, with_cp=args.with_cp, warmup=args.warmup,
                                 repeats=args.repeats, memory_steps=args.memory_steps, threads=args.threads,
                                 seed=args.seed, clock=args.clock, score_chunk_numel=args.score_chunk_numel)

    def write(path: str, text: str) -> None:
        os.makedirs(osp.dirname(osp.abspath(path)), exist_ok=True)
        with open(path, 'w') as f:
            f.write(text)

    def write_json(report: dict) -> None:
        write(args.out, json.dumps(report, indent=2))

    # the JSON is rewritten after each model: a run stopped by a time limit keeps the models it finished
    report = run_benchmark(specs, settings, args.measure, log=lambda msg: print(msg, flush=True),
                           peak_tflops=args.peak_tflops, on_model=write_json if args.out else None)
    if args.suite:
        report['suite'] = args.suite
        report['targets'] = evaluate_targets(report, SUITE_TARGETS.get(args.suite, ()))
    print(format_report(report))
    for target in report.get('targets', ()):
        print(f"target {target['target']}: {target['ratio']:.2f} ({target['relation']} {target['bound']:.2f}: "
              f"{'met' if target['met'] else 'NOT met'})")
    writers = ((args.out, lambda: json.dumps(report, indent=2)), (args.markdown, lambda: markdown_report(report)))
    for path, text in writers:
        if path:
            write(path, text())
            print(f'wrote {path}')
    return report


def cli(argv: Optional[Sequence[str]] = None) -> None:
    """:func:`main` with errors the user can fix reported as one line instead of a traceback."""
    try:
        main(argv)
    except (BenchmarkError, FileNotFoundError) as error:
        sys.exit(f'error: {error}')


if __name__ == '__main__':
    cli()
