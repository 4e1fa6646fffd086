"""``CheckImageIntegrity``: refuse JPEG and PNG files that end early, whatever the decoder makes of them.

Decoders disagree on a JPEG cut short. OpenCV 5's ``imdecode`` (mmcv's default backend, installed here) returns
nothing, and mmcv's loader fails; ``cv2.imread`` and, by their ``Premature end of JPEG file`` warnings in training
logs, earlier OpenCV builds decode the part that is there and fill the rest with grey, so the run would train on a
half-grey image with boxes and masks for the whole one. The check runs after ``LoadImageFromFile`` in every
pipeline of the configs (index 0 stays the loader, which mmdet's inference APIs replace); it reads the end of the
file (a few bytes in the usual case) and stops the run with a :class:`CorruptImageError` naming the file. When the
loader fails first, ``tools/train.py`` / ``tools/test.py`` diagnose the file with :func:`image_truncation` too.

A JPEG is complete when an end-of-image marker (``FF D9``) follows the start of its last scan (``FF DA``): inside
the entropy-coded data every ``FF`` byte is followed by ``00`` or a restart marker, so a file cut anywhere in the
image data has no ``FF D9`` after its last ``FF DA``. Bytes some writers append after the marker are allowed. A PNG
is complete when it has its ``IEND`` chunk. Other formats, and images given as arrays (inferencers), pass as they
are.
"""
import os
import os.path as osp
from typing import Optional

from mmcv.transforms import BaseTransform
from mmengine import fileio
from mmengine.registry import TRANSFORMS

_JPEG_SOI, _JPEG_EOI, _JPEG_SOS = b'\xff\xd8\xff', b'\xff\xd9', b'\xff\xda'
_PNG_SIGNATURE, _PNG_IEND = b'\x89PNG\r\n\x1a\n', b'\x00\x00\x00\x00IEND'
# the end of a complete file: the JPEG marker (+ padding some writers add), or PNG's IEND chunk and its CRC
_TAIL = 64


class CorruptImageError(RuntimeError):
    """An image of the dataset cannot be decoded."""


def truncated_image_message(path: str, problem: str) -> str:
    return (f'Image {path} is truncated: {problem}. Replace it (download or copy it again, or re-encode the '
            f'original), or remove it from the annotation file.')


def _read_ends(path: str, backend_args: Optional[dict]):
    """The first 8 bytes, the last ``_TAIL`` bytes and a function returning the whole file."""
    if backend_args is None and osp.isfile(path):
        with open(path, 'rb') as f:
            head = f.read(8)
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - _TAIL))
            tail = f.read()

        def whole() -> bytes:
            with open(path, 'rb') as f:
                return f.read()
        return head, tail, whole
    data = fileio.get(path, backend_args=backend_args)
    return data[:8], data[-_TAIL:], lambda: data


def image_truncation(path: str, backend_args: Optional[dict] = None) -> Optional[str]:
    """What is missing from the JPEG or PNG file at ``path`` if it ends early, else None (complete, or another
    format)."""
    head, tail, whole = _read_ends(path, backend_args)
    if head.startswith(_JPEG_SOI):
        if tail.endswith(_JPEG_EOI):
            return None
        data = whole()
        if data.rfind(_JPEG_EOI) > data.rfind(_JPEG_SOS) >= 0:
            return None
        return (f'the JPEG file ({len(data)} bytes) ends inside its compressed image data, without the '
                f'end-of-image marker, so part of the picture is missing (decoders that accept such a file fill '
                f'that part with grey)')
    if head.startswith(_PNG_SIGNATURE):
        if _PNG_IEND in tail or _PNG_IEND in whole():
            return None
        return 'the PNG file has no IEND chunk, so it ends before the last of its image data'
    return None


@TRANSFORMS.register_module()
class CheckImageIntegrity(BaseTransform):
    """Raise :class:`CorruptImageError` when the image file of ``results['img_path']`` is a truncated JPEG or PNG.

    Place it right after ``LoadImageFromFile`` (which keeps ``img_path``), with the same ``backend_args``. Images
    without a path (arrays passed to an inferencer) are not checked.
    """

    def __init__(self, backend_args: Optional[dict] = None) -> None:
        self.backend_args = None if backend_args is None else dict(backend_args)

    def transform(self, results: dict) -> dict:
        path = results.get('img_path')
        if isinstance(path, str):
            problem = image_truncation(path, self.backend_args)
            if problem is not None:
                raise CorruptImageError(truncated_image_message(path, problem))
        return results

    def __repr__(self) -> str:
        return f'{type(self).__name__}(backend_args={self.backend_args})'


__all__ = ['CheckImageIntegrity', 'image_truncation']
