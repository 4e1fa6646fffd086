"""The base class of every mmvisatt backbone (presets, input checks, pretrained loading, freezing)."""
from typing import Dict, Sequence, Tuple, Union

import torch.nn as nn
from mmengine.model import BaseModule
from torch import Tensor
from torch.nn.modules.batchnorm import _BatchNorm

from mmvisatt.checkpoint import load_pretrained


class AttentionBackbone(BaseModule):
    """What every mmvisatt backbone shares: arch presets, input checks, loud pretrained loading and ``train``
    with frozen stages / norm_eval.

    Subclasses set ``arch_zoo``, ``_arch_keys`` (keys an arch dict must have), ``_arch_prefix`` (the
    family-qualified preset prefix, e.g. ``'reswin'``), ``new_keys`` (patterns of parameters an official
    checkpoint does not have, such as dense-task output norms), ``in_channels`` and ``min_input_size`` (smallest
    input side the stem accepts), and implement ``_freeze_stages``.
    """
    arch_zoo: Dict[str, dict] = {}
    _arch_keys: Tuple[str, ...] = ()
    _arch_prefix = ''
    _arch_aliases = {'tiny': 't', 'small': 's', 'base': 'b', 'large': 'l'}
    new_keys: Tuple[str, ...] = ()

    @property
    def min_input_size(self) -> int:
        return self.patch_size

    @classmethod
    def _resolve_arch(cls, arch: Union[str, dict]) -> dict:
        if isinstance(arch, dict):
            missing = set(cls._arch_keys) - set(arch)
            if missing:
                raise ValueError(f'arch dict needs {sorted(missing)}')
            return dict(arch)
        key = arch.lower()
        for sep in '_-':
            key = key.replace(cls._arch_prefix + sep, '')
        key = cls._arch_aliases.get(key, key)
        if key not in cls.arch_zoo:
            names = [k for k, v in cls._arch_aliases.items() if v in cls.arch_zoo]
            raise ValueError(f"Unknown {cls.__name__} arch '{arch}'; choose one of {sorted(cls.arch_zoo)} (or "
                             f"{cls._arch_prefix}_{'/'.join(cls.arch_zoo)}, {'/'.join(names)}) or pass a dict.")
        return dict(cls.arch_zoo[key])

    @staticmethod
    def _check_out_indices(out_indices: Sequence[int], num_outputs: int) -> Tuple[int, ...]:
        if any(not -num_outputs <= i < num_outputs for i in out_indices):
            raise ValueError(f'out_indices {tuple(out_indices)} out of range for {num_outputs} outputs')
        return tuple(i % num_outputs for i in out_indices)

    def _init_from_cfg(self, family: str) -> bool:
        """Run a ``Pretrained`` (through the family converter and load report) or other mmengine ``init_cfg``.

        Returns False when there is no ``init_cfg`` and the backbone should initialise itself.
        """
        if isinstance(self.init_cfg, dict) and self.init_cfg.get('type') == 'Pretrained':
            load_pretrained(self, self.init_cfg['checkpoint'], family=family, allow_missing=self.new_keys)
            self._is_init = True
            return True
        if self.init_cfg is not None:
            super().init_weights()
            return True
        return False

    def _check_input(self, x: Tensor) -> None:
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(f'{type(self).__name__} expects images of shape (B, {self.in_channels}, H, W), got '
                             f'{tuple(x.shape)}; set in_channels={x.shape[1] if x.dim() == 4 else "?"} in the '
                             f'backbone config if the data really has that many channels.')
        if min(x.shape[-2:]) < self.min_input_size:
            raise ValueError(f'{type(self).__name__} needs images of at least {self.min_input_size}x'
                             f'{self.min_input_size} pixels (its stem), got {tuple(x.shape[-2:])}; '
                             f'resize or pad the input.')

    def _freeze_stages(self):
        raise NotImplementedError

    def _freeze(self, modules: Sequence[nn.Module]) -> None:
        for module in modules:
            module.eval()
            for p in module.parameters():
                p.requires_grad = False

    def train(self, mode: bool = True):
        super().train(mode)
        self._freeze_stages()
        if mode and self.norm_eval:
            for m in self.modules():
                if isinstance(m, (_BatchNorm, nn.GroupNorm, nn.LayerNorm)):
                    m.eval()
        return self
