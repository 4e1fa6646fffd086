"""The 15 ImageNet-C corruptions and a data-pipeline transform that applies one of them.

The corruptions are those of ImageNet-C (Hendrycks & Dietterich, "Benchmarking Neural Network Robustness to Common
Corruptions and Perturbations", ICLR 2019) in the form COCO-C / Pascal-C / Cityscapes-C use for images of any size
(Michaelis et al., "Benchmarking Robustness in Object Detection: Autonomous Driving when Winter is Coming", 2019).
Both benchmarks were made with the ``imagecorruptions`` package; its 1.1.2 release fails here on two of the
fifteen (``glass_blur``: scikit-image >= 0.19 dropped ``multichannel``; ``fog``: numpy 2 dropped ``np.float_``),
so this module uses ``imagecorruptions-imaug``, the maintained fork with the same formulas and parameters (and
a compiled glass blur, which in 1.1.2 took minutes per COCO image). It installs under the same module name.
"""
import contextlib
import inspect
import os.path as osp
import zlib
from typing import Any, Dict, Iterator, Optional, Tuple

import numpy as np
from mmcv.transforms import BaseTransform
from mmengine.registry import TRANSFORMS

CORRUPTION_GROUPS: Dict[str, Tuple[str, ...]] = {
    'noise': ('gaussian_noise', 'shot_noise', 'impulse_noise'),
    'blur': ('defocus_blur', 'glass_blur', 'motion_blur', 'zoom_blur'),
    'weather': ('snow', 'frost', 'fog', 'brightness'),
    'digital': ('contrast', 'elastic_transform', 'pixelate', 'jpeg_compression'),
}
CORRUPTIONS: Tuple[str, ...] = tuple(name for group in CORRUPTION_GROUPS.values() for name in group)
SEVERITIES: Tuple[int, ...] = (1, 2, 3, 4, 5)
# The library's functions that draw from a generator of their own rather than numpy's global one.
_OWN_SEED = ('impulse_noise', 'glass_blur')
_MIN_SIZE = 32


def _library():
    try:
        import imagecorruptions
    except ImportError as error:
        raise ImportError('the corruption benchmark needs imagecorruptions-imaug: '
                          'pip install "mmvisatt[robustness]" (requirements/robustness.txt)') from error
    if 'seed' not in inspect.signature(imagecorruptions.glass_blur).parameters:
        raise ImportError('the installed imagecorruptions is the unmaintained 1.1.2 release, whose glass_blur and '
                          'fog fail with current numpy / scikit-image: pip uninstall -y imagecorruptions && '
                          'pip install imagecorruptions-imaug')
    return imagecorruptions


def check_corruption(corruption: str, severity: int) -> None:
    """Raise a ``ValueError`` naming the valid choices when ``corruption`` or ``severity`` is not one."""
    if corruption not in CORRUPTIONS:
        raise ValueError(f'unknown corruption {corruption!r}; choose from {", ".join(CORRUPTIONS)}')
    if isinstance(severity, bool) or not isinstance(severity, (int, np.integer)) or severity not in SEVERITIES:
        raise ValueError(f'severity must be an integer from 1 to 5, got {severity!r}')


@contextlib.contextmanager
def _numpy_seeded(seed: Optional[int]) -> Iterator[None]:
    """Seed numpy's global generator (which the library draws from) and restore its state afterwards."""
    if seed is None:
        yield
        return
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(state)


def corrupt_image(img: np.ndarray, corruption: str, severity: int, seed: Optional[int] = None,
                  channel_order: str = 'bgr') -> np.ndarray:
    """Apply ``corruption`` at ``severity`` (1-5) to an ``(H, W, 3)`` image with values in [0, 255].

    The result has the shape and dtype of ``img``. ``seed`` (an integer in [0, 2**32)) makes the random
    corruptions (noise, glass blur, motion direction, snow, frost crop, fog, elastic field) reproducible; None
    draws from numpy's global generator. ``channel_order`` says how ``img`` is stored: the corruptions are
    defined on RGB (brightness works in HSV, frost and snow are coloured), mmcv loads BGR.
    """
    check_corruption(corruption, severity)
    if channel_order not in ('bgr', 'rgb'):
        raise ValueError(f"channel_order must be 'bgr' or 'rgb', got {channel_order!r}")
    if not isinstance(img, np.ndarray) or img.ndim != 3 or img.shape[2] != 3:
        raise ValueError(f'expected an (H, W, 3) image array, got {getattr(img, "shape", type(img))}; '
                         "load images with color_type='color'")
    if min(img.shape[:2]) < _MIN_SIZE:
        raise ValueError(f'the corruptions need images of at least {_MIN_SIZE}x{_MIN_SIZE} pixels, '
                         f'got {img.shape[0]}x{img.shape[1]}')
    if img.dtype == np.uint8:
        pixels = img
    elif np.issubdtype(img.dtype, np.floating):
        # e.g. LoadImageFromFile(to_float32=True): same [0, 255] range, float storage
        pixels = np.clip(np.rint(img), 0, 255).astype(np.uint8)
    else:
        raise ValueError(f'expected a uint8 or float image, got dtype {img.dtype}')
    if seed is not None and not 0 <= int(seed) < 2**32:
        raise ValueError(f'seed must be in [0, 2**32), got {seed}')

    rgb = pixels[..., ::-1] if channel_order == 'bgr' else pixels
    kwargs: Dict[str, Any] = {}
    if seed is not None and corruption in _OWN_SEED:
        kwargs['seed'] = int(seed)
    with _numpy_seeded(seed):
        out = _library().corrupt(np.ascontiguousarray(rgb), severity=int(severity), corruption_name=corruption,
                                 **kwargs)
    if channel_order == 'bgr':
        out = out[..., ::-1]
    return np.ascontiguousarray(out).astype(img.dtype, copy=False)


def image_seed(seed: int, img_path: Optional[str]) -> int:
    """A per-image seed: the same image gets the same corruption in every run and every dataloader worker.

    Derived from the file name (not the full path), so a dataset moved to another directory or machine is
    corrupted identically, as a pre-rendered COCO-C copy would be.
    """
    if img_path is None:
        return int(seed) % 2**32
    return zlib.crc32(f'{int(seed)}:{osp.basename(str(img_path))}'.encode())


@TRANSFORMS.register_module()
class CorruptImage(BaseTransform):
    """Corrupt ``results['img']`` with one ImageNet-C corruption; put it right after ``LoadImageFromFile``.

    Registered in mmengine's root registry, so ``dict(type='CorruptImage', corruption='fog', severity=3)`` builds
    in mmdet, mmseg and mmpretrain pipelines (not named ``Corrupt``: under ``default_scope='mmdet'`` that name
    finds mmdet's own transform, which has no seed and hands its BGR images to the RGB-defined corruptions).
    Annotations are left as they are, as in COCO-C: the corruptions change appearance, and elastic_transform only
    adds small, smooth local displacements.

    Args:
        corruption: one of :data:`CORRUPTIONS`.
        severity: 1 (mild) to 5 (strong).
        seed: base seed, combined with each image's file name (:func:`image_seed`); None for unseeded
            corruptions that differ on every load.
        channel_order: channel order of the loaded image (mmcv's ``LoadImageFromFile`` default is ``'bgr'``).
    """

    def __init__(self, corruption: str, severity: int, seed: Optional[int] = 0, channel_order: str = 'bgr'):
        check_corruption(corruption, severity)
        if channel_order not in ('bgr', 'rgb'):
            raise ValueError(f"channel_order must be 'bgr' or 'rgb', got {channel_order!r}")
        self.corruption = corruption
        self.severity = int(severity)
        self.seed = seed
        self.channel_order = channel_order

    def transform(self, results: dict) -> dict:
        if 'img' not in results:
            raise KeyError("CorruptImage needs results['img']: place it after LoadImageFromFile in the pipeline")
        seed = None if self.seed is None else image_seed(self.seed, results.get('img_path'))
        results['img'] = corrupt_image(results['img'], self.corruption, self.severity, seed=seed,
                                       channel_order=self.channel_order)
        return results

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}(corruption={self.corruption!r}, severity={self.severity}, '
                f'seed={self.seed}, channel_order={self.channel_order!r})')
