"""Models equivalent to official implementations, for numerical parity checks (see the shared parity contract).

``parity_model(meta, state_dict)`` builds the mmvisatt model described by a fixture's ``meta.json``, loads the
official-layout weights through the public conversion path and returns a module whose forward gives
``{'stages': [NCHW tensors at meta['stage_points']], 'logits': ...}``.

Each family keeps its builders in ``mmvisatt/testing/parity/<family>.py`` (``meta['family']``), registered with
``register_parity_builder``; the module is imported on first use.
"""
import importlib
from typing import Callable, Dict, List, Optional, Tuple

import torch.nn as nn
from torch import Tensor

from mmvisatt.checkpoint import convert_state_dict, load_into, unwrap_state_dict

_BUILDERS: Dict[Tuple[str, str], Callable[..., nn.Module]] = {}


def register_parity_builder(family: str, official_class: str):
    """Register ``fn(meta, state_dict, fused_attn) -> module`` for fixtures of ``official_class`` in ``family``."""
    def register(fn):
        _BUILDERS[(family, official_class)] = fn
        return fn
    return register


class StageTap(nn.Module):
    """Runs a backbone, records the raw outputs of chosen submodules by forward hooks, and adds a linear head.

    Hooks rather than a special forward keep the backbone exactly the module users train.
    """

    def __init__(self, backbone: nn.Module, taps: List[str], to_nchw: Callable[[Tensor], Tensor],
                 head: Optional[nn.Module] = None, pool_index: int = -1, backbone_cfg: Optional[dict] = None):
        super().__init__()
        self.backbone = backbone
        # the registry config of ``backbone`` where the builder made one (to rebuild it inside a task config)
        self.backbone_cfg = backbone_cfg
        self.head = head
        self.taps = taps
        self.pool_index = pool_index
        self._to_nchw = to_nchw
        self._captured: Dict[str, Tensor] = {}
        modules = dict(backbone.named_modules())
        for name in taps:
            modules[name].register_forward_hook(self._hook(name))

    def _hook(self, name: str):
        def capture(module, args, output):
            self._captured[name] = self._read(module, args, output)
        return capture

    def _read(self, module: nn.Module, args: tuple, output) -> Tensor:
        """What a tap records of a module's call."""
        return output[0] if isinstance(output, tuple) else output

    def forward(self, images: Tensor) -> Dict[str, object]:
        self._captured.clear()
        feats = self.backbone(images)
        result = {'stages': [self._to_nchw(self._captured[name]) for name in self.taps]}
        if self.head is not None:
            result['logits'] = self.head(feats[self.pool_index].mean(dim=(2, 3)))
        return result


def load_converted(backbone: nn.Module, head: Optional[nn.Module], state_dict: dict, family: str,
                   allow_missing=()) -> None:
    converted, _, layout = convert_state_dict(unwrap_state_dict(state_dict), family)
    load_into(backbone, {k[len('backbone.'):]: v for k, v in converted.items() if k.startswith('backbone.')},
              source='parity state dict', layout=layout, allow_missing=allow_missing)
    if head is not None:
        load_into(head, {k[len('head.fc.'):]: v for k, v in converted.items() if k.startswith('head.fc.')},
                  source='parity state dict', layout=layout)


def parity_model(meta: dict, state_dict: dict, fused_attn: bool = False) -> nn.Module:
    """Build, load and return (in eval mode) the mmvisatt equivalent of the official model in ``meta``, on the
    reference attention path (``fused_attn=False``, default) or the fused one."""
    key = (meta['family'], meta['official_class'])
    if key not in _BUILDERS:
        try:
            importlib.import_module(f'{__name__}.{meta["family"]}')
        except ModuleNotFoundError as err:
            if err.name != f'{__name__}.{meta["family"]}':
                raise
    if key not in _BUILDERS:
        raise NotImplementedError(f"No mmvisatt equivalent of {meta['official_repo']} {meta['official_class']} "
                                  f"yet; supported: {sorted(_BUILDERS)}")
    return _BUILDERS[key](meta, state_dict, fused_attn).eval()
