"""A cache for tensors derived from shapes alone (masks, distances, index maps), safe under ``torch.export``.

``functools.lru_cache`` keyed on a shape would, while ``torch.export`` (and so ``torch.onnx.export``) traces a
model, store the tracer's fake tensors: the next eager call of the same size would get them back, and a symbolic
(dynamic) size cannot be hashed at all. While exporting, the function is called afresh, so its ops enter the
graph; outside export the cache works as ``lru_cache``.
"""
import functools
from typing import Callable

import torch


def shape_cache(maxsize: int) -> Callable[[Callable], Callable]:
    """``functools.lru_cache(maxsize)`` that steps aside while ``torch.export`` traces."""

    def decorate(fn: Callable) -> Callable:
        cached = functools.lru_cache(maxsize=maxsize)(fn)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if torch.compiler.is_exporting():
                return fn(*args, **kwargs)
            return cached(*args, **kwargs)

        wrapper.cache_clear = cached.cache_clear
        wrapper.cache_info = cached.cache_info
        return wrapper

    return decorate
