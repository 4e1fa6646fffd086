"""``LoadCheckedImageFromFile``: mmcv's image loader that refuses JPEG and PNG files that end early, whatever the
decoder would make of them, checked on the bytes it fetched: one read of each image from any storage backend.

Decoders disagree on a JPEG cut short. OpenCV 5's ``imdecode`` (mmcv's default backend, installed here) returns
nothing, and mmcv's loader fails; ``cv2.imread`` and, by their ``Premature end of JPEG file`` warnings in training
logs, earlier OpenCV builds decode the part that is there and fill the rest with grey, so the run would train on a
half-grey image with boxes and masks for the whole one. Every pipeline of the configs loads its images with this
transform (at index 0, where mmdet's inference APIs put theirs), which stops the run with a
:class:`CorruptImageError` naming the file. When a loader fails first, ``tools/train.py`` / ``tools/test.py``
diagnose the file with :func:`image_truncation` too.

A JPEG is complete when an end-of-image marker (``FF D9``) follows the start of its last scan (``FF DA``): inside
the entropy-coded data every ``FF`` byte is followed by ``00`` or a restart marker, so a file cut anywhere in the
image data has no ``FF D9`` after its last ``FF DA``. Bytes some writers append after the marker are allowed. A PNG
is complete when it has its ``IEND`` chunk. Other formats pass as they are.
"""
import logging
import os
import os.path as osp
from typing import Callable, Optional

import mmcv
import numpy as np
from mmcv.transforms import LoadImageFromFile
from mmengine import fileio
from mmengine.logging import print_log
from mmengine.registry import TRANSFORMS

_JPEG_SOI, _JPEG_EOI, _JPEG_SOS = b'\xff\xd8\xff', b'\xff\xd9', b'\xff\xda'
_PNG_SIGNATURE, _PNG_IEND = b'\x89PNG\r\n\x1a\n', b'\x00\x00\x00\x00IEND'
# the end of a complete file: the JPEG marker (+ padding some writers add), or PNG's IEND chunk and its CRC
_TAIL = 64


#: the image loaders of the configs' pipelines: mmcv's, and the checked one the configs use
IMAGE_LOADERS = ('LoadImageFromFile', 'LoadCheckedImageFromFile')


class CorruptImageError(RuntimeError):
    """An image of the dataset cannot be decoded."""


def truncated_image_message(path: str, problem: str) -> str:
    return (f'Image {path} is truncated: {problem}. Replace it (download or copy it again, or re-encode the '
            f'original), or remove it from the annotation file.')


def _read_ends(path: str):
    """The first 8 bytes, the last ``_TAIL`` bytes and a function returning the whole file."""
    with open(path, 'rb') as f:
        head = f.read(8)
        size = f.seek(0, os.SEEK_END)
        f.seek(max(0, size - _TAIL))
        tail = f.read()

    def whole() -> bytes:
        with open(path, 'rb') as f:
            return f.read()
    return head, tail, whole


def _truncation(head: bytes, tail: bytes, whole: Callable[[], bytes]) -> Optional[str]:
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


def bytes_truncation(data: bytes) -> Optional[str]:
    """What is missing from the JPEG or PNG file whose content is ``data`` if it ends early, else None (complete,
    or another format)."""
    return _truncation(data[:8], data[-_TAIL:], lambda: data)


def image_truncation(path: str, backend_args: Optional[dict] = None) -> Optional[str]:
    """:func:`bytes_truncation` of the file at ``path``: a local file is read at its two ends (and whole only when
    its end is not a JPEG end marker), a file of another backend is fetched."""
    if backend_args is None and osp.isfile(path):
        return _truncation(*_read_ends(path))
    return bytes_truncation(fileio.get(path, backend_args=backend_args))


@TRANSFORMS.register_module()
class LoadCheckedImageFromFile(LoadImageFromFile):
    """mmcv's ``LoadImageFromFile`` (same arguments, same results) that raises :class:`CorruptImageError` for a
    truncated JPEG or PNG before decoding it. The check reads the bytes the loader fetched, so remote storage
    (``backend_args``) is read once per image."""

    def transform(self, results: dict) -> Optional[dict]:
        filename = results['img_path']
        try:
            if self.file_client_args is not None:
                img_bytes = fileio.FileClient.infer_client(self.file_client_args, filename).get(filename)
            else:
                img_bytes = fileio.get(filename, backend_args=self.backend_args)
        except Exception:
            if self.ignore_empty:
                return None
            raise
        problem = bytes_truncation(img_bytes)
        if problem is not None:
            raise CorruptImageError(truncated_image_message(filename, problem))
        try:
            img = mmcv.imfrombytes(img_bytes, flag=self.color_type, backend=self.imdecode_backend)
        except Exception:
            if self.ignore_empty:
                return None
            raise
        # as mmcv's loader (some decoders return None instead of raising); the train and test commands explain it
        assert img is not None, f'failed to load image: {filename}'
        if self.to_float32:
            img = img.astype(np.float32)
        results['img'] = img
        results['img_shape'] = img.shape[:2]
        results['ori_shape'] = img.shape[:2]
        return results


@TRANSFORMS.register_module()
class CheckImageIntegrity(LoadCheckedImageFromFile):
    """Deprecated: the name of the truncation check that configs of earlier versions place after
    ``LoadImageFromFile``. It is :class:`LoadCheckedImageFromFile` now (same arguments), warning once. Placed after a
    loader, as those configs have it, it keeps that loader's image and only checks the file, as it used to."""

    _warned = False

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if not CheckImageIntegrity._warned:
            CheckImageIntegrity._warned = True
            print_log("CheckImageIntegrity is deprecated: LoadCheckedImageFromFile loads and checks each image in one "
                      "read. In the config's pipelines, replace dict(type='LoadImageFromFile', ...) followed by "
                      "dict(type='CheckImageIntegrity', ...) with dict(type='LoadCheckedImageFromFile', ...) (same "
                      "arguments).", logger='current', level=logging.WARNING)

    def transform(self, results: dict) -> Optional[dict]:
        path = results.get('img_path')
        if 'img' not in results:
            return super().transform(results)
        if isinstance(path, str):
            problem = image_truncation(path, self.backend_args)
            if problem is not None:
                raise CorruptImageError(truncated_image_message(path, problem))
        return results


__all__ = ['IMAGE_LOADERS', 'LoadCheckedImageFromFile', 'CheckImageIntegrity', 'CorruptImageError',
           'bytes_truncation', 'image_truncation']
