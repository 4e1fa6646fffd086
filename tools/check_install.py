"""Check that this environment can train: ``python tools/check_install.py [--device cpu|cuda] [--size 320]``.

Prints the versions of Python, torch and its CUDA, mmcv (whether its ops are compiled, for CUDA or the CPU),
mmengine, mmdet, mmsegmentation, mmpretrain, timm and mmvisatt, and the visible GPUs; then runs ReSwin-T Mask R-CNN
once on a small random image, on the GPU where one is visible (RoIAlign and NMS on CUDA), else on the CPU. Exits 1
with the fix where something is missing or mismatched. The logic lives in :mod:`mmvisatt.apis.install_check`.
"""
import argparse
import importlib.util
import os.path as osp
import sys


def _stack_module():
    """``mmvisatt/stack.py`` without importing the package (whose import stops on an unsupported stack)."""
    spec = importlib.util.find_spec('mmvisatt')
    if spec is None:
        sys.exit('mmvisatt is not installed in this interpreter: pip install -e . (in the repository), or '
                 'tools/setup_env.sh')
    location = osp.join(list(spec.submodule_search_locations)[0], 'stack.py')
    module_spec = importlib.util.spec_from_file_location('mmvisatt_stack', location)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--device', help='where the forward runs (default: cuda where a GPU is visible, else cpu)')
    parser.add_argument('--size', type=int, default=320, help='the side of the square test image (default 320)')
    here = osp.dirname(osp.abspath(__file__))
    parser.add_argument('--config', default=osp.join(osp.dirname(here), 'configs', 'mask_rcnn_reswin_t_3x.py'),
                        help='the detector config the forward builds (default: ReSwin-T Mask R-CNN)')
    args = parser.parse_args(argv)
    try:
        import mmvisatt  # noqa: F401  (importing checks the stack)
    except ImportError as error:
        print(error)
        dists = _stack_module().installed_distributions()
        print('installed: ' + (', '.join(f'{d} {v}' for d, v in dists.items() if v) or 'no OpenMMLab distribution'))
        return 1
    from mmvisatt.apis.install_check import diagnose, forward_failure, gather, report, smoke_forward
    facts = gather()
    print(report(facts))
    problems = diagnose(facts)
    if problems:
        print('\nProblems:\n' + '\n'.join(f'- {p}' for p in problems))
        return 1
    device = args.device or ('cuda' if facts.gpus else 'cpu')
    if not facts.gpus and facts.torch_cuda:
        print('\nNo GPU is visible here, so the forward runs on the CPU. On a cluster, check a GPU node: '
              'srun --gres=gpu:1 python tools/check_install.py')
    try:
        result = smoke_forward(args.config, device, args.size)
    except Exception as error:
        print(f'\n{osp.basename(args.config)}: ' + forward_failure(error, device, facts))
        return 1
    print(f"\nForward of {result['config']} on {result['device']} at {args.size}x{args.size}: "
          f"{result['seconds']:.2f} s, {result['detections']} detections (random weights). The installation works.")
    return 0


if __name__ == '__main__':
    sys.exit(main())
