"""A cost model of a backbone's training step on an H200: every ATen op of the step, timed by the roofline.

The step (forward and backward of the backbone, loss = the mean of each output, as ``benchmark.py`` trains a
backbone) runs on the meta device, which computes shapes and no values. Each ATen op that launches a kernel
gets its FLOPs (``torch.utils.flop_counter``: matrix products, convolutions, attention) and the bytes it reads
and writes (its tensor arguments and results), and costs

    max(FLOPs / PEAK_FLOPS, bytes / BANDWIDTH) + LAUNCH

summed over the step. Views (``view``, ``permute``, slicing, ``expand``) launch nothing and cost nothing.

bf16 autocast is emulated, since autocast does not reach meta tensors: each tensor carries the dtype autocast
would have given it. A matrix product or convolution reads and writes bf16 (and a float32 operand is cast first,
a kernel of its own, as autocast's casts are); the ops autocast runs in float32 (softmax, the norms) write
float32; the others write the wider of their inputs. Weights are cast once per step, as autocast's cache does.

The parameters, with their sources (docs/performance.md, "Cost model", says how they were measured):

- PEAK_FLOPS 788 TFLOP/s: an 8192-cube bf16 ``torch.matmul`` on an H200;
- BANDWIDTH 4.3 TB/s: a device-to-device copy of 4 GiB with torch on an H200 (read + write);
- LAUNCH 4 us per kernel: a kernel launch and its gap on the stream in eager PyTorch.

It is an estimate: what a GPU run measures checks it (``tools/gpu_check.sh run`` puts both side by side).

    python tools/analysis/roofline.py                        # the T presets, timm's and mmdet's Swin-T
    python tools/analysis/roofline.py rmt_t reswin_t --shape 800 1333 --batch-size 2 --top 10
    python tools/analysis/roofline.py --markdown docs/performance.md
    python tools/analysis/roofline.py --twins --markdown docs/performance.md         # ReViT family vs twins
    python tools/analysis/roofline.py --beside work_dirs/gpu_check/benchmark.json    # measured vs estimated
"""
import argparse
import contextlib
import json
import math
import os.path as osp
import sys
from collections import defaultdict
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import flop_registry
from torch.utils.weak import WeakIdKeyDictionary

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from benchmark import (SUITES, BenchmarkSettings, Workload, _loss_of_outputs, parse_spec,  # noqa: E402
                       write_between_markers)

PEAK_FLOPS = 788e12
BANDWIDTH = 4.3e12
LAUNCH = 4e-6
#: elements a memory-efficient attention mask's rows are aligned to (pytorch/pytorch
#: aten/src/ATen/native/transformers/attention.cpp, preprocess_mask: mem_eff_alignment)
MASK_ALIGNMENT = 8
#: the widest head flash attention takes (its q, k and v of one width); wider or mixed widths take the
#: memory-efficient kernel (pytorch/pytorch aten/src/ATen/native/transformers/cuda/sdp_utils.cpp)
FLASH_MAX_HEAD_DIM = 256
#: the anchors each preset is read beside
ANCHORS = ('timm.swin_tiny_patch4_window7_224', 'mmdet.SwinTransformer')
DEFAULT_MODELS = tuple(name for name in SUITES['t-presets'] if not name.startswith('timm.')) + ANCHORS
#: each ReViT-family preset beside its twin without residual attention: the same network at the same size
TWINS = (('revit_b', 'timm.vit_base_patch16_224'), ('remvit_t', 'timm.mvitv2_tiny'),
         ('reswin_t', 'timm.swin_tiny_patch4_window7_224'))

aten = torch.ops.aten
#: ops autocast runs in bf16 (the CUDA lower-precision list, at the ATen level, forward and backward)
LOWER = {aten.mm, aten.addmm, aten.bmm, aten.baddbmm, aten.addbmm, aten.convolution, aten.convolution_backward,
         aten._scaled_dot_product_flash_attention, aten._scaled_dot_product_efficient_attention,
         aten._scaled_dot_product_cudnn_attention, aten._scaled_dot_product_flash_attention_backward,
         aten._scaled_dot_product_efficient_attention_backward, aten._scaled_dot_product_cudnn_attention_backward,
         aten._scaled_dot_product_flash_attention_for_cpu, aten._scaled_dot_product_flash_attention_for_cpu_backward}
#: ops autocast runs in float32
FLOAT32 = {aten._softmax, aten._log_softmax, aten.native_layer_norm, aten.native_group_norm, aten.native_batch_norm,
           aten._native_batch_norm_legit, aten._native_batch_norm_legit_functional, aten.linalg_vector_norm,
           aten._softmax_backward_data, aten.native_layer_norm_backward, aten.native_group_norm_backward,
           aten.native_batch_norm_backward}
#: ops that make a tensor without a kernel that touches it
FREE = {aten.empty, aten.empty_strided, aten.empty_like, aten.detach, aten.alias, aten.lift_fresh,
        aten._unsafe_view}  # a view under another name (reshape of a contiguous tensor)


def _convolution_backward_flops(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
                                output_padding, groups, output_mask) -> int:
    """The forward's FLOPs for each of the input and weight gradients asked for. (torch.utils.flop_counter counts
    a grouped convolution's input gradient as a dense one's: 257x the forward for a depthwise 3x3 on 256
    channels.)"""
    forward = 2 * (input.numel() if transposed else grad_output.numel()) * weight.shape[1] * math.prod(weight.shape[2:])
    return forward * (int(output_mask[0]) + int(output_mask[1]))


class AutocastWidths:
    """The bytes per element autocast gives each tensor (bf16 or fp16 alike), for tensors on which autocast does
    not run (the meta device): a matrix product or convolution reads and writes 2 bytes, casting a wider operand
    first (a weight once per step, as autocast's cache keeps its copy); the ops of :data:`FLOAT32` write float32;
    the others write the wider of their dimensioned inputs. :meth:`record` follows one op. Shared by the cost
    model and the memory table (``config_memory.py``)."""

    def __init__(self, weights: Sequence[torch.Tensor] = ()) -> None:
        self.width: WeakIdKeyDictionary = WeakIdKeyDictionary()  # tensor -> bytes per element under autocast
        self.weight_of: WeakIdKeyDictionary = WeakIdKeyDictionary()  # a weight or a view of it -> the weight's id
        for w in weights:
            self.weight_of[w] = id(w)
        self.cast_weights: set = set()
        self.cast: WeakIdKeyDictionary = WeakIdKeyDictionary()  # activations cast in the forward (saved in bf16)
        self.backward = False

    def __call__(self, t: torch.Tensor) -> int:
        return self.width.get(t, t.element_size())

    def record(self, func, args, kwargs, out) -> Optional[Tuple[int, int, List[Tuple[int, int, bool]]]]:
        """Give ``out`` (the result of ``func(*args, **kwargs)``) its widths. For an op that launches a kernel:
        the bytes it reads and writes, and the casts autocast makes before it, as (elements, their width, of a
        weight); None
        for a view or an op that makes a tensor without touching it."""
        if func.is_view or func.overloadpacket in FREE:
            source = next((a for a in tree_leaves(args) if isinstance(a, torch.Tensor)), None)
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor) and source is not None:
                    self.width[t] = self(source)
                    if source in self.weight_of:
                        self.weight_of[t] = self.weight_of[source]
            return None
        inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        outputs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        floating = [t for t in inputs if t.is_floating_point()]
        packet = func.overloadpacket
        casts = []
        if packet in LOWER:
            for t in floating:
                weight = self.weight_of.get(t)
                # autocast keeps a weight's bf16 copy for the step, and the backward reads the bf16 copies the
                # forward saved
                if self(t) <= 2 or weight in self.cast_weights or (self.backward and t in self.cast):
                    continue
                casts.append((t.numel(), self(t), weight is not None))
                if weight is not None:
                    self.cast_weights.add(weight)
                elif not self.backward:
                    self.cast[t] = True
            read = sum(t.numel() * (2 if t.is_floating_point() else t.element_size()) for t in inputs)
            width = 2
        else:
            read = sum(t.numel() * self(t) for t in inputs)
            # type promotion: a 0-d tensor (a gate, a scale) does not widen the dimensioned tensors it meets
            promoting = [t for t in floating if t.dim() > 0] or floating
            width = 4 if packet in FLOAT32 else max((self(t) for t in promoting), default=4)
        for t in outputs:
            if t.is_floating_point():
                self.width[t] = width
        written = sum(t.numel() * (self(t) if t.is_floating_point() else t.element_size()) for t in outputs)
        return read, written, casts


class CostModel(TorchDispatchMode):
    """Records every kernel of the ops run under it: name, FLOPs, bytes (at autocast's dtypes:
    :class:`AutocastWidths`), time."""

    def __init__(self, weights: Sequence[torch.Tensor] = ()) -> None:
        super().__init__()
        self.widths = AutocastWidths(weights)
        self.kernels: List[Dict[str, Any]] = []

    @property
    def backward(self) -> bool:
        return self.widths.backward

    @backward.setter
    def backward(self, value: bool) -> None:
        self.widths.backward = value

    def _kernel(self, name: str, flops: int, moved: int) -> None:
        compute, memory = flops / PEAK_FLOPS, moved / BANDWIDTH
        self.kernels.append(dict(op=name, flops=flops, bytes=moved, seconds=max(compute, memory) + LAUNCH,
                                 memory_bound=memory > compute))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        moved = self.widths.record(func, args, kwargs, out)
        if moved is None:
            return out
        read, written, casts = moved
        for elements, width, _ in casts:  # a cast reads the wide tensor and writes its 2-byte copy
            self._kernel('autocast cast to bf16', 0, elements * (width + 2))
        packet = func.overloadpacket
        if packet is aten.convolution_backward:
            flops = _convolution_backward_flops(*args)
        else:
            flops = flop_registry[packet](*args, **kwargs, out_val=out) if packet in flop_registry else 0
        if packet is aten.baddbmm and kwargs.get('beta', 1) != 0:
            # out of place, the input is first copied into the result (the shared checks of baddbmm and bmm:
            # result.copy_(self)), then the product accumulates into it: the product reads the result once more
            self._kernel('copy_ (baddbmm input)', 0, args[0].numel() * 2 + written)
            read += written
        self._kernel(str(packet).replace('aten.', ''), int(flops), read + written)
        return out


@contextlib.contextmanager
def gpu_attention_kernels():
    """``scaled_dot_product_attention`` on the meta device takes the kernels an H200 takes (flash attention, or
    the memory-efficient kernel where there is a mask, which reads the mask once, writes the output and its
    log-sum-exp, and in the backward writes the mask's gradient where the mask needs one), where the meta device
    alone would take the math path and write the whole score matrix. A mask whose rows are not aligned is padded
    first, as PyTorch does."""
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def on_gpu(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if q.device.type != 'meta' or enable_gqa:
            return sdpa(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                        enable_gqa=enable_gqa)
        if attn_mask is None and q.shape[-1] == k.shape[-1] == v.shape[-1] <= FLASH_MAX_HEAD_DIM:
            return aten._scaled_dot_product_flash_attention(q, k, v, dropout_p, is_causal, scale=scale)[0]
        if attn_mask is None:
            return aten._scaled_dot_product_efficient_attention(q, k, v, None, q.requires_grad, dropout_p, is_causal,
                                                                scale=scale)[0]
        if attn_mask.dtype == torch.bool:
            attn_mask = torch.zeros(attn_mask.shape, dtype=q.dtype, device=q.device)
        if attn_mask.stride(-1) != 1 or any(s % MASK_ALIGNMENT for s in attn_mask.stride()[:-1]):
            # PyTorch pads a mask whose rows do not start on an aligned address before the kernel reads it (a copy)
            length = attn_mask.shape[-1]
            attn_mask = torch.nn.functional.pad(attn_mask, (0, MASK_ALIGNMENT - length % MASK_ALIGNMENT))[..., :length]
        bias = attn_mask.expand(*q.shape[:-2], q.shape[-2], k.shape[-2])
        return aten._scaled_dot_product_efficient_attention(q, k, v, bias, q.requires_grad, dropout_p, is_causal,
                                                            scale=scale)[0]
    torch.nn.functional.scaled_dot_product_attention = on_gpu
    try:
        yield
    finally:
        torch.nn.functional.scaled_dot_product_attention = sdpa


def step_cost(name: str, shape: Sequence[int] = (800, 1333), batch_size: int = 2,
              options: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """The cost model of a training step (forward + backward, bf16 autocast) of the backbone ``name`` (a preset, a
    registry type or ``timm.NAME``, as ``benchmark.py`` names them) at ``shape`` and ``batch_size``; ``options`` go
    into the backbone's config (e.g. ``fused_attn=False``)."""
    settings = BenchmarkSettings(shape=tuple(shape), batch_size=batch_size, device='meta', warmup=0, repeats=1)
    with contextlib.redirect_stdout(sys.stderr):
        workload = Workload(parse_spec(name, options=dict(options or {})), settings)
    model = workload.model
    model.train()  # mmdet's SwinTransformer.train returns None
    parameters = list(model.parameters())
    x = torch.empty(batch_size, 3, *shape, device='meta')
    model_cost = CostModel(parameters)
    with model_cost, gpu_attention_kernels():
        loss = _loss_of_outputs(model(x))
        model_cost.backward = True
        loss.backward()
    kernels = model_cost.kernels
    seconds = sum(k['seconds'] for k in kernels)
    flops = sum(k['flops'] for k in kernels)
    by_op: Dict[str, Dict[str, float]] = defaultdict(lambda: dict(seconds=0.0, flops=0, bytes=0, kernels=0))
    for k in kernels:
        entry = by_op[k['op']]
        entry['seconds'] += k['seconds']
        entry['flops'] += k['flops']
        entry['bytes'] += k['bytes']
        entry['kernels'] += 1
    top = sorted(by_op.items(), key=lambda item: -item[1]['seconds'])
    return dict(model=name, shape=list(shape), batch_size=batch_size, kernels=len(kernels),
                seconds=seconds, tflops=flops / 1e12, achieved_tflops_per_s=flops / seconds / 1e12,
                memory_bound_share=sum(k['seconds'] for k in kernels if k['memory_bound']) / seconds,
                launch_share=LAUNCH * len(kernels) / seconds,
                top=[dict(op=op, share=v['seconds'] / seconds, **v) for op, v in top])


def markdown_table(rows: Sequence[Dict[str, Any]], top: int = 3) -> str:
    swin = next((r for r in rows if r['model'] == ANCHORS[0]), None)
    lines = ['| backbone | step (ms, estimate) | TFLOP | achieved TFLOP/s | / timm Swin-T | memory-bound share | '
             f'kernels | the {top} ops that cost most (share of the step) |',
             '|---|---|---|---|---|---|---|---|']
    for row in rows:
        ratio = f"{row['achieved_tflops_per_s'] / swin['achieved_tflops_per_s']:.2f}" if swin else ''
        ops = ', '.join(f"{t['op']} {t['share']:.0%}" for t in row['top'][:top])
        lines.append(f"| {row['model']} | {row['seconds'] * 1e3:.1f} | {row['tflops']:.2f} | "
                     f"{row['achieved_tflops_per_s']:.0f} | {ratio} | {row['memory_bound_share']:.0%} | "
                     f"{row['kernels']} | {ops} |")
    return '\n'.join(lines)


def twin_rows(shape: Sequence[int] = (800, 1333), batch_size: int = 2) -> List[Dict[str, Any]]:
    """Each of :data:`TWINS`: the preset's step, its twin's and their ratio."""
    rows = []
    for name, twin in TWINS:
        ours, theirs = step_cost(name, shape, batch_size), step_cost(twin, shape, batch_size)
        rows.append(dict(model=name, twin=twin, ms=ours['seconds'] * 1e3, twin_ms=theirs['seconds'] * 1e3,
                         ratio=ours['seconds'] / theirs['seconds'], top=ours['top']))
    return rows


def twin_table(rows: Sequence[Dict[str, Any]], top: int = 3) -> str:
    lines = ['| backbone | step (ms, estimate) | twin without residual attention | its step (ms) | ratio | '
             f'the {top} ops that cost most (share of the step) |', '|---|---|---|---|---|---|']
    for row in rows:
        ops = ', '.join(f"{t['op']} {t['share']:.0%}" for t in row['top'][:top])
        lines.append(f"| {row['model']} | {row['ms']:.1f} | {row['twin']} | {row['twin_ms']:.1f} | "
                     f"{row['ratio']:.2f} | {ops} |")
    return '\n'.join(lines)


def beside_benchmark(report: Dict[str, Any]) -> List[Dict[str, Any]]:
    """For each model of a ``benchmark.py`` report that measured a train step: the measured median, the cost
    model's estimate at the report's shape and batch, and their ratio."""
    settings = report['settings']
    rows = []
    for model in report['models']:
        measured = ((model.get('train') or {}).get('time_ms') or {}).get('median')
        if measured is None:
            continue
        estimate = step_cost(model['spec']['source'], settings['shape'], settings['batch_size'],
                             model['spec'].get('options'))
        rows.append(dict(model=model['name'], device=report['machine'].get('device'), dtype=settings['dtype'],
                         measured_ms=measured, estimate_ms=estimate['seconds'] * 1e3,
                         measured_over_estimate=measured / (estimate['seconds'] * 1e3)))
    return rows


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('models', nargs='*', help='backbones as benchmark.py names them (default: the T presets, '
                        "timm's Swin-T and mmdet's Swin-T)")
    parser.add_argument('--shape', type=int, nargs=2, default=(800, 1333), metavar=('H', 'W'))
    parser.add_argument('--batch-size', type=int, default=2)
    parser.add_argument('--top', type=int, default=10, help='ops listed per model (default 10)')
    parser.add_argument('--out', help='JSON of the rows')
    parser.add_argument('--markdown', help='a page with the roofline markers to write the table into')
    parser.add_argument('--twins', action='store_true',
                        help='the ReViT-family presets beside their twins without residual attention (timm ViT-B '
                        'with all 12 blocks, timm MViTv2-T, timm Swin-T)')
    parser.add_argument('--beside', metavar='BENCHMARK_JSON',
                        help="the estimates beside a benchmark.py report's measured train steps (its shape, batch)")
    args = parser.parse_args(argv)
    if args.beside:
        with open(args.beside) as f:
            rows = beside_benchmark(json.load(f))
        for row in rows:
            print(json.dumps(row), flush=True)
        if args.out:
            with open(args.out, 'w') as f:
                json.dump(rows, f, indent=1)
        return 0
    command = 'tools/analysis/roofline.py ' + ' '.join(argv if argv is not None else sys.argv[1:])
    if args.twins:
        rows = twin_rows(args.shape, args.batch_size)
        for row in rows:
            print(json.dumps({k: v for k, v in row.items() if k != 'top'}), flush=True)
        print(twin_table(rows))
        if args.markdown:
            write_between_markers(args.markdown, 'roofline-twins',
                                  f'<!-- written by {command} -->\n{twin_table(rows)}')
        return 0
    rows = []
    for name in args.models or DEFAULT_MODELS:
        row = step_cost(name, args.shape, args.batch_size)
        row['top'] = row['top'][:args.top]
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != 'top'}), flush=True)
        for entry in row['top']:
            print(f"    {entry['op']:<48} {entry['share']:6.1%}  {entry['seconds'] * 1e3:8.2f} ms  "
                  f"{entry['kernels']:5d} kernels", flush=True)
    print(markdown_table(rows))
    if args.out:
        with open(args.out, 'w') as f:
            json.dump(dict(peak_flops=PEAK_FLOPS, bandwidth=BANDWIDTH, launch=LAUNCH, rows=rows), f, indent=1)
    if args.markdown:
        write_between_markers(args.markdown, 'roofline', f'<!-- written by {command} -->\n{markdown_table(rows)}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
