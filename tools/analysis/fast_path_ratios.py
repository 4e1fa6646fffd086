"""Latency ratio of two backbones measured pass by pass in one process (the method of docs/performance.md).

Pairs:
  fast-path FAMILY ARCH   explicit-softmax reference path / fast path of RMT, EVT, FAN or ShuntedTransformer,
                          same weights (the reference model gets the fast model's state_dict)
  reswin                  ReSwinTransformer(arch='t') / mmdet SwinTransformer with the Swin-T shape
  remvit                  ReMViTv2(arch='t') / timm mvitv2_tiny (forward_features)

The two forward passes (eval, no grad) alternate, so load from other processes hits both; the ratio of medians
is printed. Example:
  python tools/analysis/fast_path_ratios.py fast-path RMT t --shape 800 1216 --repeats 3 --warmup 1 --threads 1
"""
import argparse
import statistics
import time

import torch
from mmengine.registry import MODELS

import mmvisatt.models  # noqa: F401  (registers the backbones)

SWITCHES = {'RMT': ('fused_attention', True, False), 'EVT': ('fused_attention', True, False),
            'FAN': ('fused_attn', True, False), 'ShuntedTransformer': ('attn_impl', 'sdpa', 'explicit')}


class TimmFeatures(torch.nn.Module):

    def __init__(self, name: str, size):
        super().__init__()
        import timm
        self.model = timm.create_model(name, pretrained=False, img_size=size, num_classes=0)

    def forward(self, x):
        return self.model.forward_features(x)


def build_pair(args):
    """(A, B, label A, label B): the ratio printed is time(A) / time(B)."""
    torch.manual_seed(args.seed)
    if args.pair == 'fast-path':
        if args.family not in SWITCHES:
            raise SystemExit(f'fast-path needs a family of {sorted(SWITCHES)}, got {args.family!r}')
        switch, fast, reference = SWITCHES[args.family]
        fast_model = MODELS.build(dict(type=args.family, arch=args.arch, **{switch: fast}))
        reference_model = MODELS.build(dict(type=args.family, arch=args.arch, **{switch: reference}))
        reference_model.load_state_dict(fast_model.state_dict())
        return reference_model, fast_model, f'{switch}={reference}', f'{switch}={fast}'
    if args.pair == 'reswin':
        from mmdet.models.backbones import SwinTransformer
        swin = SwinTransformer(embed_dims=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24), window_size=7)
        return MODELS.build(dict(type='ReSwinTransformer', arch='t')), swin, 'ReSwin-T', 'mmdet Swin-T'
    return (MODELS.build(dict(type='ReMViTv2', arch='t')), TimmFeatures('mvitv2_tiny', tuple(args.shape)),
            'ReMViTv2-T', 'timm mvitv2_tiny')


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('pair', choices=['fast-path', 'reswin', 'remvit'])
    parser.add_argument('family', nargs='?', help='fast-path: RMT, EVT, FAN or ShuntedTransformer')
    parser.add_argument('arch', nargs='?', help='fast-path: arch preset (t, hybrid_t, ...)')
    parser.add_argument('--shape', type=int, nargs=2, default=[224, 224], metavar=('H', 'W'))
    parser.add_argument('--repeats', type=int, default=7)
    parser.add_argument('--warmup', type=int, default=2)
    parser.add_argument('--threads', type=int, default=1)
    parser.add_argument('--seed', type=int, default=0)
    args = parser.parse_args()
    if args.pair == 'fast-path' and not (args.family and args.arch):
        parser.error('fast-path needs FAMILY and ARCH, e.g. "fast-path RMT t"')
    torch.set_num_threads(args.threads)
    a, b, label_a, label_b = build_pair(args)
    # mmdet's SwinTransformer.train() returns None, so no chained .eval()
    a.eval()
    b.eval()
    x = torch.randn(1, 3, *args.shape)
    times = ([], [])
    with torch.no_grad():
        for i in range(args.warmup + args.repeats):
            for model, bucket in zip((a, b), times):
                start = time.perf_counter()
                model(x)
                if i >= args.warmup:
                    bucket.append(time.perf_counter() - start)
    ta, tb = (statistics.median(t) * 1e3 for t in times)
    print(f'{args.shape[0]}x{args.shape[1]}, {args.threads} thread(s), {args.repeats} repeats: '
          f'{label_a} {ta:.1f} ms, {label_b} {tb:.1f} ms, ratio {ta / tb:.3f}')


if __name__ == '__main__':
    main()
