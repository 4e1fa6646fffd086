"""GPU memory a dense config needs per GPU: the training-step peak of its whole model, measured on the CPU.

For each config: its whole model (backbone, neck, heads; pretraining off, SyncBN as BN) is built as the config says,
at the largest batch shape its training pipeline makes (:func:`training_size`: images of a batch are padded to the
largest height and width among them), with synthetic data (a detector's images hold the 93 instances of COCO's tail,
boxes and uint8 masks, with proposals around them as a trained RPN makes them; a segmentor's a label map;
``tools/analysis/benchmark.py``'s batches). One training step (forward, losses, backward, the config's optimizer)
runs under :class:`~mmvisatt.testing.device_audit.LiveBytes`, which counts the bytes of the tensors alive, as CUDA's
allocator counts ``max_memory_allocated``, in the precision the config trains in: a config with ``AmpOptimWrapper``
is measured as AMP runs it (:class:`AutocastLiveBytes`: each tensor at the width autocast gives it, the weights,
gradients and optimizer state in float32). ``scaled_dot_product_attention`` takes the kernels a GPU takes (flash, or
memory-efficient with a mask, which keeps no score matrix: the cost model's ``gpu_attention_kernels``). The backbone
runs on the meta device.

The row is reported per GPU at the config's ``train_dataloader.batch_size``
(:func:`~mmvisatt.engine.preflight.memory.per_gpu_bytes`):

    per GPU = weights (+ AMP's copies) + 2 x gradients + optimizer state + batch x (peak of one image - weights)

The forward/backward peak of one image holds the weights, the activations and the gradients made so far; counting
the gradients once more in full (DistributedDataParallel's buckets, which hold a copy of them) and scaling the rest
with the batch makes the row an upper bound of the step's ``max_memory_allocated`` (it also counts each image's
transient buffers, such as the mask targets, once per image, though the heads make them one image at a time).
Not counted: the allocator's rounding to 512-byte blocks, cuDNN/cuBLAS workspaces and fragmentation.
``--check-batch`` measures a second batch size directly, to compare; ``--calibrate`` runs the method on the
OpenMMLab Swin configs whose peaks mmdet and mmseg publish (:data:`CALIBRATION`).

    python tools/analysis/config_memory.py configs/mask_rcnn_reswin_t_3x.py
    python tools/analysis/config_memory.py --all --out docs/config_memory.json --markdown docs/benchmarks.md
    python tools/analysis/config_memory.py --table docs/config_memory.json --markdown docs/benchmarks.md
    python tools/analysis/config_memory.py --all --presets reswin_t rmt_t --per-gpu-step --out steps.json
    python tools/analysis/config_memory.py --calibrate --markdown docs/benchmarks.md

``--all`` measures every dense config (the configs of ``mmvisatt.task_configs.expected_configs`` that train a
detector or a segmentor), sharing one measurement between configs whose model and training size are the same
(the 1x and 3x Mask R-CNN of a backbone); ``--out`` keeps the rows of configs not measured in this run.
``--per-gpu-step`` measures on a GPU (``--device``) instead what the table estimates: each config's training step at
its per-GPU batch, ``max_memory_allocated`` and the time per iteration (``tools/gpu_check.sh`` runs it for the T
presets).
"""
import argparse
import contextlib
import copy
import datetime
import gc
import json
import os
import os.path as osp
import sys
import time
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import torch
from mmengine.config import Config

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
# the development bench beside it
from benchmark import BenchmarkSettings, ModelSpec, Workload, write_between_markers  # noqa: E402
from roofline import AutocastWidths, gpu_attention_kernels  # noqa: E402

from mmvisatt.engine.preflight.memory import (GB, LIMIT_GB, TAIL_INSTANCES, amp_dtype,  # noqa: E402
                                              model_key, per_gpu_bytes, precision_label, scaled_step, table_path,
                                              training_size)
from mmvisatt.recipes import GPUS  # noqa: E402
from mmvisatt.task_configs import expected_configs  # noqa: E402
from mmvisatt.testing.device_audit import LiveBytes  # noqa: E402

GIB = 2 ** 30

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
CONFIG_DIR = osp.join(REPO, 'configs')
# also the order of --per-gpu-step, which a time limit may cut short: every preset's Mask R-CNN first, then UperNet
DENSE_PREFIXES = ('mask_rcnn_', 'upernet_', 'cascade_mask_rcnn_', 'retinanet_', 'fpn_', 'segformer_')
#: the OpenMMLab configs whose published peak the method is held against (``--calibrate``): mmdet's four Swin
#: Mask R-CNN rows (8 GPUs x 2 images, two of them fp16 AMP) and mmseg's Swin-T/S/B UperNet 512x512 rows (8 GPUs x
#: 2 images, float32). The configs and their published ``max_memory_allocated`` ship in the installed packages:
#: mmdet/.mim/configs/swin/metafile.yml "Training Memory (GB)" (open-mmlab/mmdetection@v3.3.0:
#: configs/swin/metafile.yml) and mmseg/.mim/configs/swin/metafile.yaml "Memory (GB)"
#: (open-mmlab/mmsegmentation@v1.2.2:configs/swin/metafile.yaml). Those figures are GiB: the training log's
#: ``memory`` is ``max_memory_allocated / (1024 * 1024)`` (open-mmlab/mmcv@797fc9a:mmcv/runner/hooks/logger/text.py,
#: ``_get_max_memory``), which the model-zoo script divides by 1024 (open-mmlab/mmdetection@05a9b36:
#: .dev_scripts/gather_models.py, ``convert_model_info_to_pwc``).
CALIBRATION = (('mmdet', 'mask-rcnn_swin-t-p4-w7_fpn_1x_coco'),
               ('mmdet', 'mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco'),
               ('mmdet', 'mask-rcnn_swin-t-p4-w7_fpn_amp-ms-crop-3x_coco'),
               ('mmdet', 'mask-rcnn_swin-s-p4-w7_fpn_amp-ms-crop-3x_coco'),
               ('mmseg', 'swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512'),
               ('mmseg', 'swin-small-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512'),
               ('mmseg', 'swin-base-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512'))


class AutocastLiveBytes(LiveBytes):
    """:class:`LiveBytes` of a step under AMP, emulated where autocast does not run (the meta device, and the host
    ops, which run in float32 here): each tensor counts at the width autocast gives it (the cost model's
    :class:`~roofline.AutocastWidths`), and autocast's 2-byte copy of each weight a matrix product or convolution
    reads counts from its first use (``weight_copies``) to the end of the step, as autocast's cache keeps it. The
    parameters, their gradients and the optimizer state stay float32, as mmengine's ``AmpOptimWrapper`` keeps them.
    An activation autocast casts keeps its float32 size here (its float32 original may die where its copy lives
    on): an over-count."""

    def __init__(self, weights: Sequence[torch.Tensor]) -> None:
        super().__init__()
        self.widths = AutocastWidths(weights)
        self.weight_copies = 0

    def nbytes(self, t: torch.Tensor) -> int:
        return t.untyped_storage().nbytes() // t.element_size() * self.widths(t)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        moved = self.widths.record(func, args, kwargs, out)
        for elements, _, of_weight in (moved[2] if moved else ()):
            if of_weight:
                self.weight_copies += 2 * elements
                self.live += 2 * elements
        self.add(out)
        self.peak = max(self.peak, self.live)
        return out


def dense_configs(config_dir: str = CONFIG_DIR) -> List[str]:
    return [name for name in expected_configs(config_dir) if name.startswith(DENSE_PREFIXES)]


def uses_amp(cfg: Config) -> bool:
    return amp_dtype(cfg) is not None


def _state_bytes(optimizer: torch.optim.Optimizer) -> int:
    seen, total = set(), 0
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor) and id(value) not in seen:
                seen.add(id(value))
                total += value.untyped_storage().nbytes()
    return total


class _MetaToHost(torch.autograd.Function):
    """The backbone's outputs, computed on the meta device, handed to the neck as host tensors of the same shapes
    and dtypes (random values); the neck's gradients go back to the meta device."""

    @staticmethod
    def forward(ctx, *outputs):
        return tuple(torch.randn(o.shape, dtype=o.dtype) for o in outputs)

    @staticmethod
    def backward(ctx, *grads):
        return tuple(g.to('meta') for g in grads)


@contextlib.contextmanager
def proposals_around_objects(model: torch.nn.Module) -> Iterator[None]:
    """A two-stage detector's proposals as a trained RPN makes them, around the objects: jittered copies of the
    ground-truth boxes, as many as the RPN keeps, so that every RoI sampler takes its full share of positives
    (Mask R-CNN's: 128 of 512 per image), each with a mask target made at the padded image's size. An untrained
    RPN's proposals barely meet the objects; a step with them misses most of that memory. The RPN's own losses
    and assignment run as they are."""
    rpn = getattr(model, 'rpn_head', None)
    if rpn is None:
        yield
        return
    loss_and_predict = rpn.loss_and_predict

    def around(x, samples, proposal_cfg=None):
        losses, results = loss_and_predict(x, samples, proposal_cfg=proposal_cfg)
        generator = torch.Generator().manual_seed(0)
        for result, sample in zip(results, samples):
            boxes = sample.gt_instances.bboxes
            boxes = getattr(boxes, 'tensor', boxes)
            if len(boxes) == 0 or len(result) == 0:
                continue
            pick = torch.randint(0, len(boxes), (len(result), ), generator=generator)
            base = boxes[pick].to(result.bboxes)
            size = (base[:, 2:] - base[:, :2]).repeat(1, 2)
            result.bboxes = base + 0.05 * size * torch.randn(base.shape, generator=generator).to(base)
        return losses, results
    rpn.loss_and_predict = around
    try:
        yield
    finally:
        del rpn.loss_and_predict


def run_backbone_on_meta(backbone: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Move ``backbone`` to the meta device and make its forward take host images and return host features: its
    tensors are allocated (and counted) with their shapes and dtypes, and none of its arithmetic runs. The
    ``optimizer`` is given the meta parameters in place of the host ones."""
    before = list(backbone.parameters())
    backbone.to('meta')
    moved = {id(old): new for old, new in zip(before, backbone.parameters())}
    for group in optimizer.param_groups:
        group['params'] = [moved.get(id(p), p) for p in group['params']]
    forward = backbone.forward

    def meta_forward(x, *args, **kwargs):
        outputs = forward(x.to('meta'), *args, **kwargs)
        single = isinstance(outputs, torch.Tensor)
        host = _MetaToHost.apply(*((outputs, ) if single else outputs))
        return host[0] if single else host
    backbone.forward = meta_forward


def measure_step(config: str, shape: Tuple[int, int], dtype: str, batch_size: int = 1,
                 meta_backbone: bool = True, instances: int = TAIL_INSTANCES,
                 options: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """One training step of ``config``'s model at ``shape`` under :class:`LiveBytes`: bytes of the weights
    (parameters and buffers), gradients, optimizer state, and the forward/backward peak. ``dtype`` ``'fp16'`` or
    ``'bf16'``: the step as AMP runs it (:class:`AutocastLiveBytes`; the arithmetic stays float32), with the
    weights' 2-byte copies (``weight_copies``). ``meta_backbone``: the backbone runs on the meta device
    (:func:`run_backbone_on_meta`), the neck and heads on the host. A detector's images hold ``instances`` boxes
    (and masks) each, and its proposals lie around them (:func:`proposals_around_objects`). ``options`` replace
    backbone settings."""
    settings = BenchmarkSettings(shape=shape, batch_size=batch_size, dtype='float32', device='cpu', warmup=0,
                                 repeats=1, boxes_per_image=instances)
    workload = Workload(ModelSpec(config, options=dict(options or {})), settings)
    model, optimizer = workload.model, workload.optimizer
    if meta_backbone:
        run_backbone_on_meta(model.backbone, optimizer)
    params = [p for p in model.parameters()]
    weights = sum(t.untyped_storage().nbytes() for t in params + list(model.buffers()))
    grads = sum(p.untyped_storage().nbytes() for p in params if p.requires_grad)
    model.train()
    start = time.perf_counter()
    tracker = LiveBytes() if dtype == 'float32' else AutocastLiveBytes(params)
    with tracker, gpu_attention_kernels(), proposals_around_objects(model):
        tracker.add((params, list(model.buffers()), workload.batch))
        data = model.data_preprocessor(workload.batch, True)
        loss, _ = model.parse_losses(model(**data, mode='loss'))
        if dtype != 'float32':
            tracker.widths.backward = True
        loss.backward()
        fwd_bwd_peak = tracker.peak
        optimizer.step()
    seconds = time.perf_counter() - start
    state = _state_bytes(optimizer)
    optimizer.zero_grad(set_to_none=True)
    result = dict(batch=batch_size, meta_backbone=meta_backbone, weights=weights, grads=grads, optimizer_state=state,
                  fwd_bwd_peak=fwd_bwd_peak, weight_copies=getattr(tracker, 'weight_copies', 0),
                  params=sum(p.numel() for p in params), loss=float(loss.detach()), seconds=round(seconds, 1))
    del workload, model, optimizer, data, loss, tracker
    gc.collect()
    return result


def measure_device_step(config: str, shape: Tuple[int, int], batch_size: int, amp: bool, device: str = 'cuda',
                        steps: int = 3) -> Dict[str, Any]:
    """What the table estimates, measured where the config trains: training steps of ``config`` at ``shape`` and
    ``batch_size`` (on CUDA fp16 autocast with a loss scaler where the config trains with AMP, as
    ``AmpOptimWrapper``; float32 elsewhere) after one warm-up step, a detector's with the table's instances and
    proposals: the median time of a step and, on CUDA, ``max_memory_allocated``."""
    cuda = torch.device(device).type == 'cuda'
    # the table's worst case: COCO's tail of instances, proposals around them
    settings = BenchmarkSettings(shape=shape, batch_size=batch_size, dtype='fp16' if amp and cuda else 'float32',
                                 device=device, warmup=1, repeats=steps, boxes_per_image=TAIL_INSTANCES)
    workload = Workload(ModelSpec(config), settings)
    times = []
    with proposals_around_objects(workload.model):
        workload.train_step()
        if cuda:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        for _ in range(steps):
            start = time.perf_counter()
            loss = float(workload.train_step())  # reads the loss back: the step has ended on the device
            times.append(time.perf_counter() - start)
    result = dict(config=osp.basename(config), shape=list(shape), batch_per_gpu=batch_size, dtype=settings.dtype,
                  seconds_per_iter=round(sorted(times)[len(times) // 2], 4), loss=loss, device=device)
    if cuda:
        result.update(device=torch.cuda.get_device_name(device),
                      max_memory_allocated=torch.cuda.max_memory_allocated(device),
                      max_memory_reserved=torch.cuda.max_memory_reserved(device))
    del workload
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return result


#: backbone settings that trade compute for memory, with the value that turns each off
MEMORY_SETTINGS = dict(with_cp=False, score_memory='full')


def memory_settings(cfg: Config) -> Dict[str, Any]:
    """What ``cfg``'s backbone turns on of :data:`MEMORY_SETTINGS` (activation checkpointing, a score-memory
    strategy of the ReViT family)."""
    backbone = cfg.model.get('backbone') or {}
    return {k: backbone[k] for k, off in MEMORY_SETTINGS.items() if backbone.get(k, off) != off}


def _step(config: str, cfg: Config, shape: Tuple[int, int], dtype: str, cache: Optional[dict],
          options: Optional[Dict[str, Any]] = None) -> Tuple[str, Dict[str, Any]]:
    """(model key, one-image step) of ``config`` with backbone ``options``, measured or from ``cache``."""
    if options:
        cfg = copy.deepcopy(cfg)
        cfg.model.backbone.update(options)
    key = model_key(cfg, shape, dtype)
    if cache is not None and key in cache:
        return key, cache[key]
    try:
        step = measure_step(config, shape, dtype, options=options)
    except ValueError as error:
        if 'Expected more than 1 value per channel' not in str(error):
            raise
        # BatchNorm after a global pooling (UperNet's pyramid pooling) cannot train on one image
        step = measure_step(config, shape, dtype, batch_size=2, options=options)
    if cache is not None:
        cache[key] = step
    return key, step


def measure_config(config: str, shape: Optional[Tuple[int, int]] = None, cache: Optional[dict] = None,
                   check_batch: Optional[int] = None) -> Dict[str, Any]:
    """The row of ``config``: its training size, dtype (float32, or the AMP dtype of its ``AmpOptimWrapper``,
    :func:`amp_dtype`), per-GPU batch and GPUs, the one-image step and the per-GPU bytes; for a config spread over
    more GPUs than its recipe's layout, the per-GPU bytes at that layout (``at_recipe_layout``: why it spreads);
    for a config that turns on :func:`memory_settings`, also the per-GPU bytes without them (``without``: why it
    turns them on). ``cache`` (model key -> step) shares measurements between configs. ``check_batch``: that many
    images per GPU measured directly beside the bound (``check``)."""
    cfg = Config.fromfile(config)
    shape = tuple(shape) if shape else training_size(cfg)
    dtype = amp_dtype(cfg) or 'float32'
    key, step = _step(config, cfg, shape, dtype, cache)
    batch = int(cfg.train_dataloader.batch_size)
    total = (cfg.get('auto_scale_lr') or {}).get('base_batch_size')
    row = dict(config=osp.basename(config), shape=list(shape), amp=dtype != 'float32', dtype=dtype,
               batch_per_gpu=batch, total_batch=total,
               gpus=(total // batch if total and total % batch == 0 else None), key=key,
               step=step, per_gpu=per_gpu_bytes(step, batch), kernels='gpu')
    if row['gpus'] and row['gpus'] != GPUS:
        row['at_recipe_layout'] = dict(gpus=GPUS, batch_per_gpu=total // GPUS,
                                       per_gpu=per_gpu_bytes(step, total // GPUS))
    kept = memory_settings(cfg)
    if kept:
        without_key, without = _step(config, cfg, shape, dtype, cache, {k: MEMORY_SETTINGS[k] for k in kept})
        row['without'] = dict(settings=', '.join(f'{k}={v!r}' for k, v in kept.items()),
                              per_gpu=per_gpu_bytes(without, batch), key=without_key, step=without)
    if check_batch:
        direct = measure_step(config, shape, dtype, batch_size=check_batch)
        # the direct step's peak holds every gradient by its end; DDP's buckets are counted beside it, as the bound does
        row['check'] = dict(batch=check_batch,
                            measured=direct['fwd_bwd_peak'] + direct['grads'] + direct['optimizer_state'],
                            formula=per_gpu_bytes(step, check_batch))
    return row


def published_peak(package: str, name: str) -> Tuple[str, float]:
    """The config file of ``package``'s (``'mmdet'`` or ``'mmseg'``) Swin config ``name`` as installed, and the
    training ``max_memory_allocated`` per GPU (GiB) its metafile publishes for it."""
    import importlib

    import yaml
    folder = osp.join(osp.dirname(importlib.import_module(package).__file__), '.mim', 'configs', 'swin')
    metafile = next(osp.join(folder, f) for f in ('metafile.yml', 'metafile.yaml') if osp.isfile(osp.join(folder, f)))
    with open(metafile) as f:
        models = yaml.safe_load(f)['Models']
    entry = next((m for m in models if m['Name'] == name), None)
    if entry is None:
        raise KeyError(f'{metafile} has no model {name!r}: the installed {package} is not the one the calibration '
                       'names (tools/setup_env.sh installs it)')
    meta = entry['Metadata']
    return osp.join(folder, f'{name}.py'), float(meta.get('Training Memory (GB)', meta.get('Memory (GB)')))


def calibrate(names: Optional[Sequence[str]] = None) -> List[Dict[str, Any]]:
    """The table's method on the OpenMMLab Swin configs of :data:`CALIBRATION` (or those of them named in
    ``names``), each beside the ``max_memory_allocated`` its package publishes for it, measured in the precision
    it trains in."""
    rows = []
    for package, name in CALIBRATION:
        if names and name not in names and f'{name}.py' not in names:
            continue
        config, published = published_peak(package, name)
        row = measure_config(config)
        rows.append(dict(package=package, config=name, shape=row['shape'], batch_per_gpu=row['batch_per_gpu'],
                         amp=row['amp'], dtype=row['dtype'], published_gib=published,
                         estimate_gib=round(row['per_gpu'] / GIB, 2), step=row['step'],
                         ratio=round(row['per_gpu'] / (published * GIB), 2)))
    return rows


def calibration_table(rows: Iterable[Dict[str, Any]]) -> str:
    lines = ['| config | batch shape | images / GPU | precision | published (GiB) | estimate (GiB) | '
             'estimate / published |',
             '|---|---|---|---|---|---|---|']
    for row in rows:
        amp = precision_label(row['dtype'])
        lines.append(f"| {row['package']} {row['config']} | {row['shape'][0]}x{row['shape'][1]} | "
                     f"{row['batch_per_gpu']} | {amp} | "
                     f"{row['published_gib']} | {row['estimate_gib']:.2f} | {row['ratio']:.2f} |")
    return '\n'.join(lines)


def _gb(n: int) -> str:
    return f'{n / GB:.1f}'


def markdown_table(rows: Iterable[Dict[str, Any]]) -> str:
    lines = ['| config | training size | batch / GPU (GPUs) | precision | params (M) | one image (GB) | per GPU (GB) | '
             'per GPU without its memory settings (GB) |',
             '|---|---|---|---|---|---|---|---|']
    for row in sorted(rows, key=lambda r: r['config']):
        step = row['step']
        one = per_gpu_bytes(step, 1) - 2 * step['grads']  # one image's step, not distributed
        gpus = f" ({row['gpus']})" if row.get('gpus') else ''
        amp = precision_label(row['dtype'])
        flag = ' **over 80**' if row['per_gpu'] > LIMIT_GB * GB else ''
        without = row.get('without')
        without = f"{_gb(without['per_gpu'])} without {without['settings']}" if without else '-'
        lines.append(f"| {row['config']} | {row['shape'][0]}x{row['shape'][1]} | {row['batch_per_gpu']}{gpus} | "
                     f"{amp} | {step['params'] / 1e6:.1f} | {_gb(one)} | {_gb(row['per_gpu'])}{flag} | {without} |")
    return '\n'.join(lines)


def write_markdown(path: str, rows: Sequence[Dict[str, Any]], when: str) -> None:
    """Put the table between the config-memory markers of ``path``."""
    write_between_markers(path, 'config-memory', '<!-- written by tools/analysis/config_memory.py from '
                          f'docs/config_memory.json; measured {when} -->\n{markdown_table(rows)}')


def step_order(name: str, presets: Optional[Sequence[str]] = None) -> Tuple[int, int, str]:
    """Sort key of a dense config for ``--per-gpu-step``: its task (:data:`DENSE_PREFIXES`), then its preset's place in
    ``presets`` (the order given on the command line), then the name."""
    preset = config_preset(name)
    task = next((i for i, prefix in enumerate(DENSE_PREFIXES) if name.startswith(prefix)), len(DENSE_PREFIXES))
    rank = list(presets).index(preset) if presets and preset in presets else len(presets or ())
    return task, rank, name


def config_preset(name: str) -> str:
    """The backbone preset of a dense config name: ``mask_rcnn_evt_swin_t_3x.py`` -> ``evt_swin_t``."""
    stem = name[:-3] if name.endswith('.py') else name
    for prefix in sorted(DENSE_PREFIXES, key=len, reverse=True):
        if stem.startswith(prefix):
            stem = stem[len(prefix):]
            break
    return stem.split('_1x')[0].split('_3x')[0].split('_160k')[0].split('_80k')[0]


def measure_on_device(configs: Sequence[str], args: argparse.Namespace) -> int:
    """``--per-gpu-step``: :func:`measure_device_step` of each config (1x and 3x of one model once), one JSON line each;
    a config that fails is reported and the others still run."""
    rows, seen, failed = [], {}, 0
    table, path = {}, table_path()
    if path is not None:
        with open(path) as f:
            table = json.load(f)['rows']
    for config in configs:
        cfg = Config.fromfile(config)
        shape = tuple(args.shape) if args.shape else training_size(cfg)
        key = model_key(cfg, shape, 'amp' if uses_amp(cfg) else 'float32')
        batch = int(cfg.train_dataloader.batch_size)
        if (key, batch) in seen:
            row = dict(seen[(key, batch)], config=osp.basename(config))
        else:
            try:
                row = measure_device_step(config, shape, batch, uses_amp(cfg), device=args.device, steps=args.steps)
            except Exception as error:  # one config's failure (out of memory, say) is a result too
                row = dict(config=osp.basename(config), error=f'{type(error).__name__}: {str(error)[:300]}')
                failed += 1
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
            seen[(key, batch)] = row
        estimate = table.get(osp.basename(config))
        if estimate is not None and 'error' not in row:
            # the table's row at this step's size and batch: what the device measured checks it
            row['table_per_gpu'] = per_gpu_bytes(scaled_step(estimate, shape), batch)
            if row.get('max_memory_allocated'):
                row['measured_over_table'] = round(row['max_memory_allocated'] / row['table_per_gpu'], 3)
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.out:
            with open(args.out, 'w') as f:
                json.dump(rows, f, indent=1)
    return 1 if failed else 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('configs', nargs='*', help='config files')
    parser.add_argument('--all', action='store_true', help='every dense config of configs/')
    parser.add_argument('--shape', type=int, nargs=2, metavar=('H', 'W'), help='instead of the training size')
    parser.add_argument('--check-batch', type=int, help='also measure this batch size directly, to compare')
    parser.add_argument('--out', help='JSON of the rows (rows of other configs already there are kept)')
    parser.add_argument('--table', help='write the markdown table from this JSON without measuring')
    parser.add_argument('--markdown', help='a page with the config-memory markers to write the table into')
    parser.add_argument('--threads', type=int, help='torch threads (default: torch\'s)')
    parser.add_argument('--resume', action='store_true', help='skip the configs that have a row in --out already')
    parser.add_argument('--presets', nargs='+', metavar='PRESET',
                        help='with --all: only the configs of these backbone presets (e.g. reswin_t rmt_t); '
                             '--per-gpu-step measures them task by task, in this order')
    parser.add_argument('--per-gpu-step', action='store_true',
                        help="instead of the table's estimate: each config's training steps at its per-GPU batch on "
                             '--device (max_memory_allocated on CUDA, time per iteration)')
    parser.add_argument('--calibrate', action='store_true',
                        help="the method on mmdet's Swin Mask R-CNN and mmseg's Swin UperNet configs beside the peaks "
                             'their packages publish')
    parser.add_argument('--device', default='cuda', help='for --per-gpu-step (default: cuda)')
    parser.add_argument('--steps', type=int, default=3, help='for --per-gpu-step: timed steps after the warm-up')
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.table:
        with open(args.table) as f:
            data = json.load(f)
        if args.markdown:
            write_markdown(args.markdown, list(data['rows'].values()), data['measured'])
        print(markdown_table(data['rows'].values()))
        return 0
    if args.calibrate:
        table = calibration_table(calibrate())
        print(table)
        if args.markdown:
            write_between_markers(args.markdown, 'calibration', '<!-- written by tools/analysis/config_memory.py '
                                  f'--calibrate --markdown {args.markdown} -->\n{table}')
        return 0
    configs = [osp.join(CONFIG_DIR, name) for name in dense_configs()] if args.all else args.configs
    if args.presets:
        configs = [c for c in configs if config_preset(osp.basename(c)) in args.presets]
    if args.per_gpu_step:
        configs = sorted(configs, key=lambda c: step_order(osp.basename(c), args.presets))
    if not configs:
        parser.error('name config files or pass --all')
    if args.per_gpu_step:
        return measure_on_device(configs, args)
    data = dict(rows={})
    if args.out and osp.isfile(args.out):
        with open(args.out) as f:
            data = json.load(f)
    # the steps already measured, of the configs as they are and without their memory settings
    cache = {r['key']: r['step'] for row in data['rows'].values() for r in (row, row.get('without') or {})
             if 'step' in r}
    when = datetime.date.today().isoformat()
    for config in configs:
        if args.resume and osp.basename(config) in data['rows']:
            continue
        row = measure_config(config, tuple(args.shape) if args.shape else None, cache, args.check_batch)
        data['rows'][row['config']] = row
        print(json.dumps({k: v for k, v in row.items() if k not in ('step', 'without')} | dict(
            one_image_gb=round((per_gpu_bytes(row['step'], 1) - 2 * row['step']['grads']) / GB, 2),
            per_gpu_gb=round(row['per_gpu'] / GB, 2), seconds=row['step']['seconds'])), flush=True)
        if args.out:
            data.update(measured=when, method=__doc__.split('\n\n')[1].replace('\n', ' '),
                        machine=f'{os.cpu_count()} CPU cores, torch {torch.__version__}')
            with open(args.out + '.tmp', 'w') as f:
                json.dump(data, f, indent=1, sort_keys=True)
            os.replace(args.out + '.tmp', args.out)
    if args.markdown:
        write_markdown(args.markdown, list(data['rows'].values()), data.get('measured', when))
    return 0


if __name__ == '__main__':
    sys.exit(main())
