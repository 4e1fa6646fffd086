"""Latency ratio of two models measured pass by pass in one process (the method of docs/development.md).

Pairs:
  fast-path FAMILY ARCH   reference path / fused path (fused_attn=False / True) of RMT, EVT, FANViT,
                          FANHybrid, FANSwin, ShuntedTransformer, ReSwinTransformer, ReViT or ReMViTv2, same
                          weights (the reference model gets the fast model's state_dict)
  reswin                  ReSwinTransformer(arch='t') / mmdet SwinTransformer of the same shape and settings
                          (--residual-mode aligned for the position-aligned residual scores)
  reswin-det              a whole detector config with a ReSwin backbone (--config, default
                          configs/mask_rcnn_reswin_t_1x.py) / the same detector with mmdet's SwinTransformer of
                          the same shape in its place; every tensor the two share (neck, heads, output norms)
                          gets the ReSwin model's values. A pass is the config's test_step (preprocessing,
                          prediction, post-processing) on one synthetic image.
  remvit                  ReMViTv2(arch='t') / timm mvitv2_tiny (forward_features)

The two forward passes (eval, no grad) alternate, so load from other processes hits both; the ratio of medians
is printed. Example:
  python tools/analysis/fast_path_ratios.py fast-path RMT t --shape 800 1216 --repeats 3 --warmup 1 --threads 1
  python tools/analysis/fast_path_ratios.py reswin-det --shape 800 1216 --repeats 3 --warmup 1 --threads 1
With --clock cpu the times are the process's CPU time instead of elapsed time: on a machine shared with other
jobs that leaves out the waits for a core (memory-bandwidth contention remains), so the ratio scatters less.
It also prints that CPU time split into user and system time, with the minor page faults per pass (where the OS
reports them, via getrusage): system time is mostly the kernel handing out fresh zeroed pages for large maps,
which varies from run to run with the machine's memory state, while user time is the computation itself.
--profile adds one profiled pass of each model, its self CPU time by kind of op (linear layers, attention
kernels, convolutions, other): what both paths share bounds the ratio any attention kernel can give.
"""
import argparse
import inspect
import os.path as osp
import statistics

import torch
from mmengine.registry import MODELS

import mmvisatt.models  # noqa: F401  (registers the backbones)
from benchmark import (ALLOCATORS, CLOCKS, TimmFeatures, apply_allocator, cpu_split, cpu_usage, current_allocator,
                       time_pass)

# the backbones, each with two attention paths under the one ``fused_attn`` switch
FAMILIES = ('RMT', 'EVT', 'FANViT', 'FANHybrid', 'FANSwin', 'ShuntedTransformer', 'ReSwinTransformer', 'ReViT',
            'ReMViTv2')
DET_CONFIG = osp.join(osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))), 'configs',
                      'mask_rcnn_reswin_t_1x.py')
# ReSwinTransformer arguments that mmdet's SwinTransformer takes under the same name and meaning
SWIN_SHARED_ARGS = ('in_channels', 'patch_size', 'window_size', 'mlp_ratio', 'qkv_bias', 'drop_rate',
                    'attn_drop_rate', 'drop_path_rate', 'out_indices', 'frozen_stages', 'with_cp')


def swin_like(reswin_cfg: dict) -> dict:
    """The mmdet ``SwinTransformer`` config with the shape and settings of a ``ReSwinTransformer`` config
    (unset arguments take ReSwin's defaults, so both sides agree even where the two classes' defaults differ)."""
    from mmvisatt.models.backbones import ReSwinTransformer
    defaults = {name: p.default for name, p in inspect.signature(ReSwinTransformer).parameters.items()}
    arch = ReSwinTransformer._resolve_arch(reswin_cfg.get('arch', defaults['arch']))
    cfg = dict(type='mmdet.SwinTransformer', embed_dims=arch['embed_dims'], depths=tuple(arch['depths']),
               num_heads=tuple(arch['num_heads']), **{k: reswin_cfg.get(k, defaults[k]) for k in SWIN_SHARED_ARGS})
    cfg['strides'] = (cfg['patch_size'], 2, 2, 2)[:len(cfg['depths'])]
    # mmdet sizes its MLP as mlp_ratio * embed_dims, which must come out an int
    if float(cfg['mlp_ratio']).is_integer():
        cfg['mlp_ratio'] = int(cfg['mlp_ratio'])
    return cfg


def build_detector_pair(config: str, shape, seed: int = 0):
    """(ReSwin detector, Swin detector, batch, names of the tensors copied from the first to the second)."""
    from benchmark import BenchmarkSettings, ModelSpec, build_model, det_batch, resolve
    resolved = resolve(ModelSpec(config), shape=tuple(shape))
    backbone = resolved.cfg.get('backbone') or {}
    if backbone.get('type') != 'ReSwinTransformer':
        raise SystemExit(f'reswin-det needs a config whose model.backbone is a ReSwinTransformer, got '
                         f'{backbone.get("type")!r} in {config}')
    torch.manual_seed(seed)
    reswin = build_model(resolved, 'ReSwin detector')
    resolved.cfg = dict(resolved.cfg, backbone=swin_like(backbone))
    swin = build_model(resolved, 'Swin detector')
    theirs = swin.state_dict()
    shared = {k: v for k, v in reswin.state_dict().items() if k in theirs and theirs[k].shape == v.shape}
    swin.load_state_dict(shared, strict=False)
    batch = det_batch(reswin, BenchmarkSettings(shape=tuple(shape), seed=seed))
    return reswin, swin, batch, sorted(shared)


# aten ops by the kind of work they do, for --profile (self CPU time of each op, so nothing is counted twice)
OP_KINDS = {
    'linear layers (GEMM)': ('aten::addmm', 'aten::mm'),
    'attention kernels': ('aten::_scaled_dot_product_flash_attention_for_cpu', 'aten::bmm', 'aten::baddbmm',
                          'aten::_softmax', 'aten::_scaled_dot_product_attention_math'),
    'convolutions': ('aten::mkldnn_convolution', 'aten::_convolution', 'aten::convolution',
                     'aten::_slow_conv2d_forward', 'aten::thnn_conv2d'),
}


def profile_pass(run, model) -> dict:
    """Self CPU time (ms) of one pass by kind of op (:data:`OP_KINDS`, the rest as 'other'), and the total."""
    from torch.profiler import ProfilerActivity, profile
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
        run(model)
    kinds = dict.fromkeys([*OP_KINDS, 'other', 'total'], 0.)
    for event in prof.key_averages():
        ms = event.self_cpu_time_total / 1e3
        kind = next((k for k, names in OP_KINDS.items() if event.key in names), 'other')
        kinds[kind] += ms
        kinds['total'] += ms
    return kinds


def build_pair(args):
    """(A, B, label A, label B, run): the ratio printed is time(A) / time(B); ``run(model)`` is one pass."""
    torch.manual_seed(args.seed)
    if args.pair == 'reswin-det':
        reswin, swin, batch, shared = build_detector_pair(args.config, args.shape, args.seed)
        not_shared = [k for k in swin.state_dict() if not k.startswith('backbone.') and k not in shared]
        if not_shared:
            raise SystemExit(f'the Swin detector has parts the ReSwin one lacks: {not_shared[:5]}')
        print(f'{len(shared)} tensors shared (every one outside the backbone, and the output norms)')
        return reswin, swin, 'ReSwin detector', 'Swin detector', lambda model: model.test_step(batch)
    x = torch.randn(1, 3, *args.shape)
    run = lambda model: model(x)  # noqa: E731
    if args.pair == 'fast-path':
        if args.family not in FAMILIES:
            raise SystemExit(f'fast-path needs a family of {sorted(FAMILIES)}, got {args.family!r}')
        fast_model = MODELS.build(dict(type=args.family, arch=args.arch, fused_attn=True))
        reference_model = MODELS.build(dict(type=args.family, arch=args.arch, fused_attn=False))
        reference_model.load_state_dict(fast_model.state_dict())
        return reference_model, fast_model, 'fused_attn=False', 'fused_attn=True', run
    if args.pair == 'reswin':
        import mmdet.models  # noqa: F401  (registers mmdet.SwinTransformer)
        reswin_cfg = dict(type='ReSwinTransformer', arch='t', residual_mode=args.residual_mode)
        swin = MODELS.build(swin_like(reswin_cfg))
        return MODELS.build(reswin_cfg), swin, 'ReSwin-T', 'mmdet Swin-T', run
    return (MODELS.build(dict(type='ReMViTv2', arch='t')),
            TimmFeatures('mvitv2_tiny', tuple(args.shape), features_only=False, pad_to=1),
            'ReMViTv2-T', 'timm mvitv2_tiny', run)


def main(argv=None):
    """Parse, measure, print; returns (median ms of A, median ms of B)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('pair', choices=['fast-path', 'reswin', 'reswin-det', 'remvit'])
    parser.add_argument('family', nargs='?', help='fast-path: ' + ', '.join(FAMILIES))
    parser.add_argument('arch', nargs='?', help='fast-path: arch preset (t, hybrid_t, ...)')
    parser.add_argument('--config', default=DET_CONFIG, help='reswin-det: detector config with a ReSwin backbone')
    parser.add_argument('--residual-mode', choices=['official', 'aligned'],
                        help="reswin: ReSwin-T's residual alignment (default: the preset's, 'official')")
    parser.add_argument('--shape', type=int, nargs=2, default=[224, 224], metavar=('H', 'W'))
    parser.add_argument('--repeats', type=int, default=7)
    parser.add_argument('--warmup', type=int, default=2)
    parser.add_argument('--threads', type=int, default=1)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--clock', choices=sorted(CLOCKS), default='wall',
                        help="wall: elapsed time; cpu: this process's CPU time, which leaves out the time other "
                        "processes hold the core (with one thread nothing else runs in parallel)")
    parser.add_argument('--allocator', choices=ALLOCATORS, default='default',
                        help='CPU allocator for the passes (as tools/analysis/benchmark.py): jemalloc, glibc-retain '
                        'or default; the command re-executes itself with it')
    parser.add_argument('--profile', action='store_true',
                        help='after the timed passes, profile one more pass of each model and print its self CPU '
                        'time by kind of op (linear layers, attention kernels, convolutions, other)')
    args = parser.parse_args(argv)
    apply_allocator(args.allocator, from_command_line=argv is None)
    if args.pair == 'fast-path' and not (args.family and args.arch):
        parser.error('fast-path needs FAMILY and ARCH, e.g. "fast-path RMT t"')
    torch.set_num_threads(args.threads)
    a, b, label_a, label_b, run = build_pair(args)
    # mmdet's SwinTransformer.train() returns None, so no chained .eval()
    a.eval()
    b.eval()
    clock = CLOCKS[args.clock]
    split = args.clock == 'cpu' and cpu_usage() is not None
    times, usages, outputs = ([], []), ([], []), [None, None]
    with torch.no_grad():
        for i in range(args.warmup + args.repeats):
            for j, model in enumerate((a, b)):
                elapsed, usage, outputs[j] = time_pass(lambda: run(model), clock, split)
                if i >= args.warmup:
                    times[j].append(elapsed)
                    if split:
                        usages[j].append(usage)
    ta, tb = (statistics.median(t) * 1e3 for t in times)
    print(f'{args.shape[0]}x{args.shape[1]}, {args.threads} thread(s), {args.clock} clock, '
          f'{current_allocator()} allocator, '
          f'{args.repeats} repeats: '
          f'{label_a} {ta:.1f} ms, {label_b} {tb:.1f} ms, ratio {ta / tb:.3f}')
    # the pass-by-pass ratios show how far load from other processes moved the median
    print('per pass (ms): ' + ', '.join(f'{x * 1e3:.0f}/{y * 1e3:.0f}' for x, y in zip(*times)))
    if split:
        (ua, sa, fa), (ub, sb, fb) = ([c[k]['median'] for k in ('user_ms', 'system_ms', 'minor_faults')]
                                      for c in map(cpu_split, usages))
        # the kernel may account CPU time in scheduler ticks, so a tiny model's pass can read 0
        user_ratio = f'{ua / ub:.3f}' if ub > 0 else 'n/a'
        print(f'CPU time split (medians per pass): user {label_a} {ua:.1f} ms, {label_b} {ub:.1f} ms, '
              f'ratio {user_ratio}; system {sa:.1f} ms / {sb:.1f} ms; '
              f'minor page faults {fa:.0f} / {fb:.0f}')
    if args.profile:
        # where each model's time goes: work both paths share (GEMMs, convolutions) bounds the possible ratio
        profiles = [profile_pass(run, model) for model in (a, b)]
        print(f'one profiled pass each, self CPU time by kind of op: {label_a} / {label_b}')
        for kind in profiles[0]:
            a_ms, b_ms = profiles[0][kind], profiles[1][kind]
            shares = '' if kind == 'total' else (f' ({100 * a_ms / profiles[0]["total"]:.0f}% / '
                                                 f'{100 * b_ms / profiles[1]["total"]:.0f}%)')
            print(f'  {kind}: {a_ms:.1f} / {b_ms:.1f} ms{shares}')
    if args.pair == 'reswin-det':
        # the mask head runs once per kept box, so unequal detection counts would make the shared part unequal
        print('detections in the last pass: ' + ', '.join(
            f'{label} {len(out[0].pred_instances)}' for label, out in zip((label_a, label_b), outputs)))
    return ta, tb


if __name__ == '__main__':
    main()
