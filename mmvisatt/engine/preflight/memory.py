"""Whether a dense config's training step fits the GPU it runs on: the per-GPU peak estimated from the measured
table (``docs/config_memory.json``, written by ``tools/analysis/config_memory.py``), scaled to the batch the run
asks for, against the memory of the GPU that is visible (80 GB where none is).

The table's rows are measured, and this module holds what both the measurement and the check need: the largest
batch shape a training pipeline makes (:func:`training_size`), the key of a measured model (:func:`model_key`)
and the per-GPU bound at a batch size (:func:`per_gpu_bytes`).
"""
import hashlib
import json
import os.path as osp
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from mmengine.config import Config

GB = 1e9
#: the GPU memory every dense config must fit at its per-GPU batch (an A100 / H100 80 GB), and what the check
#: assumes where no GPU is visible
LIMIT_GB = 80.0
#: instances per image in a detector's measured step: the most one COCO train2017 image holds (93, counted in
#: fchollet/deep-learning-with-python-notebooks#299; "more than 90" in Megvii-BaseDetection/YOLOX#499). Its
#: ground-truth boxes meet every anchor in the assigners' IoU matrices.
TAIL_INSTANCES = 93
#: sources of each orientation the batch sampler groups (AspectRatioBatchSampler: width >= height, or not), as
#: (height, width) at COCO's 640-pixel long side, from square to 3:1
_ASPECTS = (1.0, 1.25, 4 / 3, 1.5, 1333 / 800, 1.8, 2.0, 2.5, 3.0)
_LANDSCAPE = tuple((640 / r, 640.0) for r in _ASPECTS)
_PORTRAIT = tuple((640.0, 640 / r) for r in _ASPECTS if r > 1)


def _scales(step: Dict[str, Any]) -> List[Tuple[float, float]]:
    """The target scales of a resize, as mmcv reads them: ``scale`` or ``scales`` (w, h), times the ends of
    ``ratio_range``; a RandomResize with two scales and no ratio draws between them, so its ends and their larger
    corner count."""
    kind = str(step.get('type', '')).split('.')[-1]
    scales = step.get('scales') or step.get('scale')
    if scales is None:
        return []
    if isinstance(scales, (int, float)) or (len(scales) == 2 and isinstance(scales[0], (int, float))):
        scales = [scales]
    scales = [(float(s), float(s)) if isinstance(s, (int, float)) else (float(s[0]), float(s[1])) for s in scales]
    if kind == 'RandomResize' and step.get('ratio_range'):
        return [(w * r, h * r) for w, h in scales for r in step['ratio_range']]
    if kind == 'RandomResize' and len(scales) == 2:
        scales.append((max(scales[0][0], scales[1][0]), max(scales[0][1], scales[1][1])))
    return scales


def _resize(hw: Tuple[float, float], scale: Tuple[float, float], keep_ratio: bool) -> Tuple[float, float]:
    h, w = hw
    if not keep_ratio:
        return scale[1], scale[0]
    factor = min(max(scale) / max(h, w), min(scale) / min(h, w))
    return round(h * factor), round(w * factor)


def _crop(hw: Tuple[float, float], step: Dict[str, Any]) -> List[Tuple[float, float]]:
    """The extreme outputs of a random crop (mmdet's and mmseg's ``crop_type`` / ``crop_size``, (h, w))."""
    h, w = hw
    size = step['crop_size']
    size = (size, size) if isinstance(size, (int, float)) else tuple(size)
    kind = step.get('crop_type', 'absolute')
    if kind == 'absolute_range':  # each side drawn in [lo, hi], whichever the image's orientation
        return [(min(h, a), min(w, b)) for a in size for b in size]
    if kind == 'relative':
        return [(h * size[0], w * size[1])]
    if kind == 'relative_range':
        return [(h * a, w * b) for a in (size[0], 1.0) for b in (size[1], 1.0)]
    return [(min(h, size[0]), min(w, size[1]))]


def _walk(steps: Sequence[Any], shapes: Iterable[Tuple[float, float]]) -> List[Tuple[float, float]]:
    """Every (h, w) ``steps`` can make from ``shapes``, at the extremes of each random choice (a crop can turn a
    landscape image into a portrait one, which a following keep-ratio resize then scales up)."""
    shapes = list(shapes)
    for step in steps:
        if isinstance(step, (list, tuple)):
            shapes = _walk(step, shapes)
            continue
        kind = str(step.get('type', '')).split('.')[-1]
        if kind == 'RandomChoice':
            shapes = [hw for branch in step['transforms']
                      for hw in _walk(branch if isinstance(branch, (list, tuple)) else [branch], shapes)]
        elif kind in ('Resize', 'RandomResize', 'RandomChoiceResize') and _scales(step):
            keep = step.get('keep_ratio', False)
            shapes = [_resize(hw, scale, keep) for hw in shapes for scale in _scales(step)]
        elif kind == 'FixShapeResize':
            shapes = [_resize(hw, (step['width'], step['height']), step.get('keep_ratio', False))
                      for hw in shapes]
        elif kind == 'RandomCrop' and step.get('crop_size') is not None:
            shapes = [out for hw in shapes for out in _crop(hw, step)]
        elif kind == 'Pad' and step.get('size') is not None:
            w, h = step['size']
            shapes = [(max(hh, h), max(ww, w)) for hh, ww in shapes]
        shapes = sorted(set(shapes))
    return shapes


def training_size(cfg: Config) -> Tuple[int, int]:
    """The largest (height, width) a batch of the config's training pipeline is padded to (before the data
    preprocessor's padding to a multiple of 32, which the model applies itself): images of a batch are padded to
    the largest height and the largest width among them. With mmdet's ``AspectRatioBatchSampler`` a batch holds
    sources of one orientation, and a pipeline that crops can still give it both (a portrait crop of a landscape
    photo, scaled up by the next resize); a batch of one image is as large as one output."""
    loader = cfg.train_dataloader
    dataset = loader.dataset
    while 'pipeline' not in dataset and 'dataset' in dataset:  # RepeatDataset / ConcatDataset wrappers
        dataset = dataset.dataset
    pipeline = dataset.get('pipeline') or []
    grouped = str((loader.get('batch_sampler') or {}).get('type', '')).endswith('AspectRatioBatchSampler')
    groups = [_LANDSCAPE, _PORTRAIT] if grouped else [_LANDSCAPE + _PORTRAIT]
    outputs = [_walk(pipeline, group) for group in groups]
    if any(set(out) == set(group) for out, group in zip(outputs, groups)):
        raise ValueError('no resize or crop in the training pipeline to take the size from: pass --shape H W')
    if int(loader.get('batch_size', 1)) == 1:
        shapes = [hw for out in outputs for hw in out]
    else:
        shapes = [(max(h for h, _ in out), max(w for _, w in out)) for out in outputs]
    h, w = max(shapes, key=lambda hw: (hw[0] * hw[1], hw[1]))  # of two as large, the landscape one
    return int(h), int(w)


def is_detector(cfg: Config) -> bool:
    return any(head in cfg.model for head in ('rpn_head', 'roi_head', 'bbox_head'))


def _sizes_only(value: Any) -> Any:
    """``value`` (a model's config) without where its weights come from (``init_cfg``, ``pretrained``), which
    changes no tensor's size."""
    if isinstance(value, dict):
        return {k: _sizes_only(v) for k, v in value.items() if k not in ('init_cfg', 'pretrained')}
    if isinstance(value, (list, tuple)):
        return [_sizes_only(v) for v in value]
    return value


def model_key(cfg: Config, shape: Tuple[int, int], dtype: str) -> str:
    """Configs with the same model, optimizer type, size and dtype share one measurement (the learning rate, which
    the 1x and 3x recipes set apart, and the weights a model starts from change no tensor's size); a detector's
    also names its instances per image."""
    optimizer = ((cfg.get('optim_wrapper') or {}).get('optimizer') or {}).get('type')
    key = [_sizes_only(cfg.model.to_dict()), optimizer, shape, dtype]
    key += [TAIL_INSTANCES] if is_detector(cfg) else []
    text = json.dumps(key, sort_keys=True, default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def amp_dtype(cfg: Config) -> Optional[str]:
    """``'fp16'`` or ``'bf16'`` for a config trained with mmengine's ``AmpOptimWrapper`` (float16 unless it names
    another dtype), None for one trained in float32."""
    wrapper = cfg.get('optim_wrapper') or {}
    if not str(wrapper.get('type', '')).endswith('AmpOptimWrapper'):
        return None
    return 'bf16' if str(wrapper.get('dtype') or 'float16') in ('bfloat16', 'torch.bfloat16', 'bf16') else 'fp16'


def per_gpu_bytes(step: Dict[str, Any], batch_size: int) -> int:
    """The upper bound of ``tools/analysis/config_memory.py``'s table at ``batch_size`` images per GPU, from a
    measured step of ``step['batch']`` images (one, or two for a model whose BatchNorm sees a single value per
    channel at one)::

        weights (+ AMP's 2-byte copies) + gradients + DDP's gradient buckets + optimizer state
            + batch x (forward/backward peak of one image - weights)

    Distributed training keeps its gradients twice: ``DistributedDataParallel`` all-reduces them through buckets of
    their size, and mmengine's wrapper leaves ``gradient_as_bucket_view`` off (torch/nn/parallel/distributed.py,
    the argument's documentation: "the saved memory size will be equal to the total gradients size")."""
    once = step['weights'] + step.get('weight_copies', 0)
    per_image = (step['fwd_bwd_peak'] - once) / step.get('batch', 1)
    return int(once + 2 * step['grads'] + step['optimizer_state'] + batch_size * per_image)


def table_path() -> Optional[str]:
    """The measured table: in an installed package's ``.mim/docs`` (setup.py puts it there), else in the source
    checkout the package is imported from; None where neither has it."""
    package = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
    for path in (osp.join(package, '.mim', 'docs', 'config_memory.json'),
                 osp.join(osp.dirname(package), 'docs', 'config_memory.json')):
        if osp.isfile(path):
            return path
    return None


def _config_chain(config_file: str) -> List[str]:
    """``config_file`` and the files it inherits from, nearest first."""
    chain, todo = [], [osp.abspath(config_file)]
    while todo:
        path = todo.pop(0)
        if path in chain or not osp.isfile(path):
            continue
        chain.append(path)
        try:
            bases = Config._get_base_files(path)
        except Exception:  # a base the parser cannot read: the config itself failed or will fail elsewhere
            bases = []
        # a base in another package (mmdet::...) holds no row of this table
        todo.extend(osp.join(osp.dirname(path), base) for base in bases if '::' not in str(base))
    return chain


def table_row(config_file: str, rows: Dict[str, Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The row of ``config_file``, or of the nearest config it inherits from that has one."""
    for path in _config_chain(config_file):
        row = rows.get(osp.basename(path))
        if row is not None:
            return row
    return None


def visible_gpu_memory() -> Tuple[float, str]:
    """Bytes of the GPU this process trains on and its name; 80 GB and 'no GPU visible' where there is none."""
    import torch
    if torch.cuda.is_available():
        properties = torch.cuda.get_device_properties(torch.cuda.current_device())
        return float(properties.total_memory), properties.name
    return LIMIT_GB * GB, f'no GPU is visible here: assumed {LIMIT_GB:.0f} GB'


def scaled_step(row: Dict[str, Any], shape: Sequence[int]) -> Dict[str, Any]:
    """``row``'s measured step with its activations scaled by pixels to ``shape``."""
    step = dict(row['step'])
    scale = (shape[0] * shape[1]) / (row['shape'][0] * row['shape'][1])
    if scale != 1:
        once = step['weights'] + step.get('weight_copies', 0)
        step['fwd_bwd_peak'] = once + (step['fwd_bwd_peak'] - once) * scale
    return step


def precision_label(dtype: str) -> str:
    """How the pages and the warning name a row's precision: ``'float32'`` or ``'AMP (fp16)'``."""
    return 'float32' if dtype == 'float32' else f'AMP ({dtype})'


def row_step(cfg: Config, row: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The measured step of ``row`` whose model is ``cfg``'s (the row as measured, or without its memory settings),
    None where ``cfg`` changes the model (another arch, ``with_cp``, another head or optimizer type)."""
    for measured in (row, row.get('without') or {}):
        if measured.get('key') == model_key(cfg, tuple(row['shape']), row['dtype']) and 'step' in measured:
            return measured['step']
    return None


def find_row(cfg: Config, config_file: str, rows: Dict[str, Dict[str, Any]]
             ) -> Tuple[Optional[Dict[str, Any]], Optional[Dict[str, Any]]]:
    """The row that measured ``cfg``'s model and its step: the row of ``config_file`` or of the nearest config it
    inherits from, else any row of the same model (a run that sets another preset's arch finds that preset's row).
    Where none did: the inherited row (or None) and None."""
    inherited = table_row(config_file, rows)
    for row in [inherited] + [r for r in rows.values() if r is not inherited]:
        step = row_step(cfg, row) if row else None
        if step is not None:
            return row, step
    return inherited, None


def _model_changes(cfg: Config, row_config: Optional[str]) -> str:
    """The model keys ``cfg`` sets apart from the config ``row_config`` (a path), as ``key = ours (its row: theirs)``,
    a key one of them leaves to the default as ``default``."""
    if row_config is None or not osp.isfile(row_config):
        return ''
    theirs = _flat(_sizes_only(Config.fromfile(row_config).model.to_dict()), 'model')
    ours = _flat(_sizes_only(cfg.model.to_dict()), 'model')
    missing = object()
    changed = [f"{k} = {_shown(ours.get(k, missing), missing)} (its row: {_shown(theirs.get(k, missing), missing)})"
               for k in sorted(set(ours) | set(theirs)) if ours.get(k, missing) != theirs.get(k, missing)]
    return ', '.join(changed[:3]) + (f' and {len(changed) - 3} more' if len(changed) > 3 else '')


def _shown(value: Any, missing: Any) -> str:
    return 'default' if value is missing else repr(value)


def _flat(value: Any, prefix: str) -> Dict[str, Any]:
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in _flat(item, f'{prefix}.{key}').items()}
    return {prefix: value}


def estimate_per_gpu(cfg: Config, row: Dict[str, Any], step: Optional[Dict[str, Any]] = None,
                     dtype: Optional[str] = None) -> Tuple[int, Tuple[int, int], Dict[str, Any]]:
    """The per-GPU peak of ``cfg``'s training step from ``row`` (its ``step``, the row's own by default): its bound at
    the batch ``cfg`` asks for, with the activations scaled by pixels where ``cfg``'s pipeline makes another size
    than the row's, and doubled where the row was measured in AMP and the run (``dtype``) trains in float32 (each
    tensor takes at least 2 bytes under autocast); that size, and the step the bound is computed from."""
    try:
        shape = training_size(cfg)
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        # a pipeline the walker cannot read (no resize, a transform of its own): the row's size
        shape = tuple(row['shape'])
    step = scaled_step(dict(row, step=step or row['step']), shape)
    if row['dtype'] != 'float32' and (dtype or row['dtype']) == 'float32':
        once = step['weights'] + step.get('weight_copies', 0)
        step.update(fwd_bwd_peak=step['weights'] + 2 * (step['fwd_bwd_peak'] - once), weight_copies=0)
    return per_gpu_bytes(step, int(cfg.train_dataloader.batch_size)), shape, step


def check_gpu_memory(cfg: Config, config_file: str, table: Optional[str] = None) -> List[str]:
    """Warn (and return the warning) when the estimated per-GPU peak of the run exceeds the visible GPU's memory,
    naming the estimate, where it comes from, and the fixes. The run is estimated from the row of its own model
    (:func:`find_row`) in its precision (with no GPU visible, in the recipe's: the float32 fall-back is the CPU's).
    Where no row measured its model (another arch than its preset's, ``with_cp`` turned on), it is estimated from
    the row it inherits, and the log says so, what the run changes and how to measure it."""
    import torch
    from mmengine.logging import print_log
    table = table or table_path()
    if table is None or not cfg.get('train_dataloader'):
        return []
    with open(table) as f:
        rows = json.load(f)['rows']
    row, step = find_row(cfg, config_file, rows)
    if row is None:
        return []
    chain = _config_chain(config_file)
    inherited = next((p for p in chain if osp.basename(p) == row['config']), None)
    source = (row['config'] if row['config'] == osp.basename(config_file) else
              f"{row['config']} ({'inherited' if inherited else 'the same model'})")
    assumed = ''
    if step is None:
        step = row['step']
        changes = _model_changes(cfg, inherited)
        assumed = (f'; no row measured this run\'s model, so this assumes the model of that row, which the run '
                   f'changes{" in " + changes if changes else ""}: measure it with python '
                   f'tools/analysis/config_memory.py {config_file}')
        print_log(f'GPU memory: no row of the measured table (docs/config_memory.json) measured this run\'s model: '
                  f'it is estimated from row {source}, whose model it changes{" in " + changes if changes else ""}. '
                  f'Measure it: python tools/analysis/config_memory.py {config_file}', logger='current')
    dtype = (amp_dtype(cfg) or 'float32') if torch.cuda.is_available() else row['dtype']
    estimate, shape, step = estimate_per_gpu(cfg, row, step, dtype)
    memory, device = visible_gpu_memory()
    if estimate <= memory:
        return []
    batch = int(cfg.train_dataloader.batch_size)
    per_image = per_gpu_bytes(step, 2) - per_gpu_bytes(step, 1)
    fits = int((memory - per_gpu_bytes(step, 0)) // per_image) if per_image > 0 else 0
    scaled = '' if list(shape) == list(row['shape']) else f", scaled from its {row['shape'][0]}x{row['shape'][1]}"
    precision = precision_label(dtype)
    if dtype != row['dtype']:
        precision += f", from the row's {'float32' if row['dtype'] == 'float32' else 'AMP'} step"
    fixes = []
    if not (cfg.model.get('backbone') or {}).get('with_cp'):
        fixes.append("checkpoint the backbone's activations (--cfg-options model.backbone.with_cp=True)")
    if dtype == 'float32':
        fixes.append('train with mixed precision (--amp)')
    fixes.append(f'train {fits} images per GPU on more GPUs (--cfg-options train_dataloader.batch_size={fits}, and '
                 '--auto-scale-lr where the total batch changes)' if fits >= 1 else
                 'as not one image fits by this estimate, a GPU with more memory')
    message = (f'this run needs about {estimate / GB:.1f} GB per GPU at {batch} images per GPU of '
               f'{shape[0]}x{shape[1]} in {precision} (the measured table docs/config_memory.json, row '
               f'{source}{scaled}; an upper bound of max_memory_allocated{assumed}), more than the '
               f'{memory / GB:.1f} GB of the GPU ({device}). Fix: ' + ', or '.join(fixes) + '.')
    print_log(message, logger='current', level=30)
    return [message]
