"""GPU memory a dense config needs per GPU: the training-step peak of its whole model, measured on the CPU.

For each config: its whole model (backbone, neck, heads; pretraining off, SyncBN as BN) is built as the config
says, at the largest image its training pipeline makes (:func:`training_size`: 800x1333 for the COCO recipes,
the crop for the segmentation ones), with one image of synthetic data (8 boxes and masks for a detector, a label
map for a segmentor; ``tools/analysis/benchmark.py``'s batches). One training step (forward, losses, backward,
the config's optimizer) runs under :class:`~mmvisatt.testing.device_audit.LiveBytes`, which counts the bytes of
the tensors alive, as CUDA's allocator counts ``max_memory_allocated``. A config trained with AMP runs under
bf16 autocast (2-byte activations, as fp16 on a GPU), where the CPU runs the model in it; otherwise float32, and
the row says that it is an upper bound.

The row is reported per GPU at the config's ``train_dataloader.batch_size``:

    per GPU = weights + gradients + optimizer state + batch x (forward/backward peak of one image - weights)

The forward/backward peak of one image holds the weights, the activations and the gradients made so far; counting
the gradients once more in full and scaling the rest with the batch makes the row an upper bound of the step's
``max_memory_allocated`` (exact in the activations, which grow with the batch; above it by what of the gradients
is not alive at the activations' peak). Not counted: the CUDA context and cuDNN/cuBLAS workspaces (about 0.5-1 GB
on an H100) and the allocator's fragmentation; ``--check-batch`` measures a second batch size directly, to compare.

    python tools/analysis/config_memory.py configs/mask_rcnn_reswin_t_3x.py
    python tools/analysis/config_memory.py --all --out docs/config_memory.json --markdown docs/benchmarks.md
    python tools/analysis/config_memory.py --table docs/config_memory.json --markdown docs/benchmarks.md
    python tools/analysis/config_memory.py --all --presets reswin_t rmt_t --per-gpu-step --out steps.json

``--all`` measures every dense config (the configs of ``mmvisatt.task_configs.expected_configs`` that train a
detector or a segmentor), sharing one measurement between configs whose model and training size are the same
(the 1x and 3x Mask R-CNN of a backbone); ``--out`` keeps the rows of configs not measured in this run.
``--per-gpu-step`` measures on a GPU (``--device``) instead what the table estimates: each config's training step at
its per-GPU batch, ``max_memory_allocated`` and the time per iteration (``tools/gpu_check.sh`` runs it for the T
presets).
"""
import argparse
import contextlib
import datetime
import gc
import hashlib
import json
import os
import os.path as osp
import sys
import time
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from mmengine.config import Config

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from benchmark import BenchmarkSettings, ModelSpec, Workload  # noqa: E402  (the development bench beside it)

from mmvisatt.task_configs import expected_configs  # noqa: E402
from mmvisatt.testing.device_audit import LiveBytes  # noqa: E402

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
CONFIG_DIR = osp.join(REPO, 'configs')
GB = 1e9
_CPU_FLASH = 1  # torch._fused_sdp_choice's answer for the CPU's flash kernel (sdp::SDPBackend::flash_attention)
#: the GPU memory every dense config must fit at its per-GPU batch (an A100 / H100 80 GB)
LIMIT_GB = 80.0
# also the order of --per-gpu-step, which a time limit may cut short: every preset's Mask R-CNN first, then UperNet
DENSE_PREFIXES = ('mask_rcnn_', 'upernet_', 'cascade_mask_rcnn_', 'retinanet_', 'fpn_', 'segformer_')
MARK_BEGIN, MARK_END = '<!-- config-memory: begin -->', '<!-- config-memory: end -->'


def dense_configs(config_dir: str = CONFIG_DIR) -> List[str]:
    return [name for name in expected_configs(config_dir) if name.startswith(DENSE_PREFIXES)]


def _box(scale: Any) -> Tuple[int, int]:
    """(short, long) of a keep-ratio scale (mmcv reads (w, h) or (long, short) alike: the image fits both)."""
    a, b = (int(scale), int(scale)) if isinstance(scale, (int, float)) else (int(scale[0]), int(scale[1]))
    return min(a, b), max(a, b)


def _walk(steps: Sequence[Any], size: Optional[Tuple[int, int]]) -> Optional[Tuple[int, int]]:
    """The largest (h, w) after ``steps``, from ``size`` (None: any image, as large as the resizes allow)."""
    for step in steps:
        if isinstance(step, (list, tuple)):
            size = _walk(step, size)
            continue
        kind = str(step.get('type', '')).split('.')[-1]
        if kind == 'RandomChoice':
            branches = [_walk(b if isinstance(b, (list, tuple)) else [b], size) for b in step['transforms']]
            branches = [b for b in branches if b is not None]
            size = max(branches, key=lambda hw: hw[0] * hw[1]) if branches else size
        elif kind in ('Resize', 'RandomResize', 'RandomChoiceResize') and (step.get('scale') or step.get('scales')):
            scales = step.get('scales') or [step['scale']]
            ratio = max(step.get('ratio_range') or (1.0, 1.0)) if kind == 'RandomResize' else 1.0
            short, long = max((_box(s) for s in scales), key=lambda sl: sl[0] * sl[1])
            size = (int(short * ratio), int(long * ratio))
        elif kind in ('RandomCrop', 'FixShapeResize') and step.get('crop_size') is not None and size is not None:
            crop = step['crop_size']
            crop = (crop, crop) if isinstance(crop, int) else (int(crop[0]), int(crop[1]))
            size = (min(size[0], crop[0]), min(size[1], crop[1]))
        elif kind == 'Pad' and step.get('size') is not None:
            w, h = step['size']
            size = (int(h), int(w))
    return size


def training_size(cfg: Config) -> Tuple[int, int]:
    """The largest (height, width) the config's training pipeline makes (before the data preprocessor's padding
    to a multiple of 32, which the model applies itself)."""
    dataset = cfg.train_dataloader.dataset
    while 'pipeline' not in dataset and 'dataset' in dataset:  # RepeatDataset / ConcatDataset wrappers
        dataset = dataset.dataset
    size = _walk(dataset.get('pipeline') or [], None)
    if size is None:
        raise ValueError('no resize or crop in the training pipeline to take the size from: pass --shape H W')
    return size


def uses_amp(cfg: Config) -> bool:
    return str((cfg.get('optim_wrapper') or {}).get('type', '')).endswith('AmpOptimWrapper')


def model_key(cfg: Config, shape: Tuple[int, int], dtype: str) -> str:
    """Configs with the same model, optimizer type, size and dtype share one measurement (the learning rate, which
    the 1x and 3x recipes set apart, changes no tensor's size)."""
    optimizer = ((cfg.get('optim_wrapper') or {}).get('optimizer') or {}).get('type')
    text = json.dumps([cfg.model.to_dict(), optimizer, shape, dtype], sort_keys=True, default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def _state_bytes(optimizer: torch.optim.Optimizer) -> int:
    seen, total = set(), 0
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor) and id(value) not in seen:
                seen.add(id(value))
                total += value.untyped_storage().nbytes()
    return total


@contextlib.contextmanager
def cpu_ops_in_float32() -> Iterator[None]:
    """mmcv's RoIAlign and NMS have no bf16 kernels on the CPU (their CUDA kernels run fp16): under bf16 autocast
    they compute in float32 here, and RoIAlign hands back bf16, as its CUDA kernel gives under AMP."""
    import mmcv.ops  # noqa: F401  (the package's names are the functions; the modules are in sys.modules)
    align, nms = sys.modules['mmcv.ops.roi_align'], sys.modules['mmcv.ops.nms']
    roi_align, nms_op = align.roi_align, nms.NMSop

    def float32_roi_align(input, rois, *args, **kwargs):
        if input.dtype == torch.bfloat16 and input.device.type == 'cpu':
            return roi_align(input.float(), rois.float(), *args, **kwargs).to(input.dtype)
        return roi_align(input, rois, *args, **kwargs)

    class Float32NMS:
        @staticmethod
        def apply(boxes, scores, *args):
            return nms_op.apply(boxes.float(), scores.float(), *args)

    align.roi_align, nms.NMSop = float32_roi_align, Float32NMS
    try:
        yield
    finally:
        align.roi_align, nms.NMSop = roi_align, nms_op


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
def meta_sdpa_as_on_the_host() -> Iterator[None]:
    """``scaled_dot_product_attention`` on the meta device takes the kernel the host would take for the same
    shapes and dtypes (the CPU's flash kernel, which, like CUDA's flash and memory-efficient kernels, never holds
    the score matrix), where the meta device alone would take the math path and count a full score matrix."""
    sdpa = F.scaled_dot_product_attention

    def host_choice(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if q.device.type != 'meta':
            return sdpa(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                        enable_gqa=enable_gqa)
        like = [torch.empty(t.shape, dtype=t.dtype, requires_grad=t.requires_grad) if t is not None else None
                for t in (q, k, v, attn_mask)]
        choice = torch._fused_sdp_choice(*like[:3], attn_mask=like[3], dropout_p=dropout_p, is_causal=is_causal,
                                         scale=scale, enable_gqa=enable_gqa)
        if choice != _CPU_FLASH:
            return sdpa(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                        enable_gqa=enable_gqa)
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)[0]
    F.scaled_dot_product_attention = host_choice
    try:
        yield
    finally:
        F.scaled_dot_product_attention = sdpa


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
                 meta_backbone: bool = True) -> Dict[str, Any]:
    """One training step of ``config``'s model at ``shape`` under :class:`LiveBytes`: bytes of the weights
    (parameters and buffers), gradients, optimizer state, and the forward/backward peak. ``meta_backbone``: the
    backbone runs on the meta device (:func:`run_backbone_on_meta`), the neck and heads on the host."""
    settings = BenchmarkSettings(shape=shape, batch_size=batch_size, dtype=dtype, device='cpu', warmup=0, repeats=1)
    workload = Workload(ModelSpec(config), settings)
    model, optimizer = workload.model, workload.optimizer
    if meta_backbone:
        run_backbone_on_meta(model.backbone, optimizer)
    params = [p for p in model.parameters()]
    weights = sum(t.untyped_storage().nbytes() for t in params + list(model.buffers()))
    grads = sum(p.untyped_storage().nbytes() for p in params if p.requires_grad)
    model.train()
    start = time.perf_counter()
    tracker = LiveBytes()
    with tracker, cpu_ops_in_float32(), meta_sdpa_as_on_the_host():
        tracker.add((params, list(model.buffers()), workload.batch))
        with workload.autocast():
            data = model.data_preprocessor(workload.batch, True)
            loss, _ = model.parse_losses(model(**data, mode='loss'))
        loss.backward()
        fwd_bwd_peak = tracker.peak
        optimizer.step()
    seconds = time.perf_counter() - start
    state = _state_bytes(optimizer)
    optimizer.zero_grad(set_to_none=True)
    result = dict(batch=batch_size, meta_backbone=meta_backbone, weights=weights, grads=grads, optimizer_state=state,
                  fwd_bwd_peak=fwd_bwd_peak,
                  params=sum(p.numel() for p in params), loss=float(loss.detach()), seconds=round(seconds, 1))
    del workload, model, optimizer, data, loss, tracker
    gc.collect()
    return result


def measure_device_step(config: str, shape: Tuple[int, int], batch_size: int, amp: bool, device: str = 'cuda',
                        steps: int = 3) -> Dict[str, Any]:
    """What the table estimates, measured where the config trains: training steps of ``config`` at ``shape`` and
    ``batch_size`` (on CUDA fp16 autocast with a loss scaler where the config trains with AMP, as
    ``AmpOptimWrapper``; float32 elsewhere) after one warm-up step: the median time of a step and, on CUDA,
    ``max_memory_allocated`` (CUDA events time the steps)."""
    cuda = torch.device(device).type == 'cuda'
    settings = BenchmarkSettings(shape=shape, batch_size=batch_size, dtype='fp16' if amp and cuda else 'float32',
                                 device=device, warmup=1, repeats=steps)
    workload = Workload(ModelSpec(config), settings)
    workload.train_step()
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    times = []
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


def per_gpu_bytes(step: Dict[str, Any], batch_size: int) -> int:
    """The module docstring's upper bound at ``batch_size`` images per GPU, from a :func:`measure_step` of
    ``step['batch']`` images (one, or two for a model whose BatchNorm sees a single value per channel at one)."""
    per_image = (step['fwd_bwd_peak'] - step['weights']) / step.get('batch', 1)
    return int(step['weights'] + step['grads'] + step['optimizer_state'] + batch_size * per_image)


_BF16_VERDICTS: Dict[str, Tuple[str, Optional[str]]] = {}


def _runs_in_bf16(config: str, cfg: Config, shape: Tuple[int, int]) -> Tuple[str, Optional[str]]:
    """'bf16' when a config trained with AMP runs its step under bf16 autocast on the CPU, else 'float32' and why
    (mmcv's CPU RoIAlign, for one, has no bf16 kernel). Tried once per backbone type and heads, at 256x256 at most."""
    key = json.dumps([cfg.model.backbone.get('type'), {k: v for k, v in cfg.model.items() if k != 'backbone'}],
                     sort_keys=True, default=str)
    if key not in _BF16_VERDICTS:
        try:
            measure_step(config, (min(shape[0], 256), min(shape[1], 256)), 'bf16')
            _BF16_VERDICTS[key] = ('bf16', None)
        except RuntimeError as error:
            _BF16_VERDICTS[key] = ('float32', f'{type(error).__name__}: {str(error).splitlines()[0][:160]}')
    return _BF16_VERDICTS[key]


def measure_config(config: str, shape: Optional[Tuple[int, int]] = None, cache: Optional[dict] = None,
                   check_batch: Optional[int] = None, bf16: bool = True) -> Dict[str, Any]:
    """The row of ``config``: its training size, dtype, per-GPU batch and GPUs, the one-image step and the per-GPU
    bytes. ``cache`` (model key -> step) shares measurements between configs. ``bf16`` False measures an AMP config
    in float32, its upper bound (bf16 arithmetic is emulated, and slow, on CPUs without bf16 instructions)."""
    cfg = Config.fromfile(config)
    shape = tuple(shape) if shape else training_size(cfg)
    amp = uses_amp(cfg)
    if amp and not bf16:
        dtype, why_float32 = 'float32', 'bf16 not asked for (--float32)'
    else:
        dtype, why_float32 = _runs_in_bf16(config, cfg, shape) if amp else ('float32', None)
    key = model_key(cfg, shape, dtype)
    if cache is not None and key in cache:
        step = cache[key]
    else:
        try:
            step = measure_step(config, shape, dtype)
        except ValueError as error:
            if 'Expected more than 1 value per channel' not in str(error):
                raise
            # BatchNorm after a global pooling (UperNet's pyramid pooling) cannot train on one image
            step = measure_step(config, shape, dtype, batch_size=2)
        if cache is not None:
            cache[key] = step
    batch = int(cfg.train_dataloader.batch_size)
    total = (cfg.get('auto_scale_lr') or {}).get('base_batch_size')
    row = dict(config=osp.basename(config), shape=list(shape), amp=amp, dtype=dtype, batch_per_gpu=batch,
               total_batch=total, gpus=(total // batch if total and total % batch == 0 else None), key=key,
               step=step, per_gpu=per_gpu_bytes(step, batch), upper_bound_float32=bool(amp and dtype == 'float32'))
    if why_float32:
        row['why_float32'] = why_float32
    if check_batch:
        direct = measure_step(config, shape, dtype, batch_size=check_batch)
        row['check'] = dict(batch=check_batch, measured=direct['fwd_bwd_peak'] + direct['optimizer_state'],
                            formula=per_gpu_bytes(step, check_batch))
    return row


def _gb(n: int) -> str:
    return f'{n / GB:.1f}'


def markdown_table(rows: Iterable[Dict[str, Any]]) -> str:
    lines = ['| config | training size | batch / GPU (GPUs) | AMP | params (M) | one image (GB) | per GPU (GB) |',
             '|---|---|---|---|---|---|---|']
    for row in sorted(rows, key=lambda r: r['config']):
        step = row['step']
        one = per_gpu_bytes(step, 1) - step['grads']
        gpus = f" ({row['gpus']})" if row.get('gpus') else ''
        amp = 'bf16' if row['dtype'] == 'bf16' else ('float32, upper bound' if row['amp'] else 'no (float32)')
        flag = ' **over 80**' if row['per_gpu'] > LIMIT_GB * GB else ''
        lines.append(f"| {row['config']} | {row['shape'][0]}x{row['shape'][1]} | {row['batch_per_gpu']}{gpus} | "
                     f"{amp} | {step['params'] / 1e6:.1f} | {_gb(one)} | {_gb(row['per_gpu'])}{flag} |")
    return '\n'.join(lines)


def write_markdown(path: str, rows: Sequence[Dict[str, Any]], when: str) -> None:
    """Put the table between the config-memory markers of ``path``."""
    with open(path) as f:
        text = f.read()
    if MARK_BEGIN not in text or MARK_END not in text:
        raise ValueError(f'{path} has no {MARK_BEGIN} ... {MARK_END} section to write the table into')
    head, rest = text.split(MARK_BEGIN, 1)
    _, tail = rest.split(MARK_END, 1)
    body = (f'{MARK_BEGIN}\n<!-- written by tools/analysis/config_memory.py from docs/config_memory.json; '
            f'measured {when} -->\n{markdown_table(rows)}\n{MARK_END}')
    with open(path, 'w') as f:
        f.write(head + body + tail)


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
    parser.add_argument('--float32', action='store_true',
                        help='measure AMP configs in float32 too: their upper bound, without emulated bf16')
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
    cache = {row['key']: row['step'] for row in data['rows'].values()} if args.all else {}
    when = datetime.date.today().isoformat()
    for config in configs:
        if args.resume and osp.basename(config) in data['rows']:
            continue
        row = measure_config(config, tuple(args.shape) if args.shape else None, cache, args.check_batch,
                             bf16=not args.float32)
        data['rows'][row['config']] = row
        print(json.dumps({k: v for k, v in row.items() if k != 'step'} | dict(
            one_image_gb=round((per_gpu_bytes(row['step'], 1) - row['step']['grads']) / GB, 2),
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
