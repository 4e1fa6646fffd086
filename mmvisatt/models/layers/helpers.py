"""Argument checks every backbone and layer shares, so that a wrong value reads the same everywhere."""
from typing import Sequence, TypeVar

T = TypeVar('T')


def check_choice(name: str, value: T, choices: Sequence[T]) -> T:
    """``value`` if it is one of ``choices``; otherwise a ValueError that names the argument and the choices."""
    if value not in choices:
        raise ValueError(f'{name} must be one of {list(choices)}, got {value!r}')
    return value
