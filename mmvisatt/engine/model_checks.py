"""Run-time checks of what only the built model can tell: the neck's input channels against the backbone's outputs,
and a ``load_from`` backbone in another layout. Registered in mmengine's root ``HOOKS``."""
from typing import Any, List, Optional

import torch
from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS

from mmvisatt.checkpoint import CheckpointMismatchError, convert_backbone_layout


def _channel_list(value: Any) -> Optional[List[int]]:
    if isinstance(value, int):
        return [value]
    if isinstance(value, (list, tuple)) and all(isinstance(v, int) for v in value):
        return list(value)
    return None


def _path_in_config(model: torch.nn.Module, module: torch.nn.Module) -> str:
    for name, child in model.named_children():
        if child is module:
            return f'model.{name}'
    return 'model.neck'


@HOOKS.register_module()
class ChannelCheckHook(Hook):
    """At the first forward, check that the neck's ``in_channels`` are what the backbone outputs.

    Raises a ``ValueError`` naming both channel lists and the config key to change instead of the convolution
    shape error mmdet/mmseg would give. Models without a ``backbone`` and a ``neck`` with ``in_channels`` are left
    alone. ``tools/train.py`` / ``tools/test.py`` add it.
    """

    priority = 'VERY_HIGH'

    def __init__(self) -> None:
        self._handle = None

    def _install(self, runner) -> None:
        if self._handle is not None:
            return
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        backbone, neck = getattr(model, 'backbone', None), getattr(model, 'neck', None)
        if isinstance(neck, (list, torch.nn.Sequential)) or neck is None or backbone is None:
            return
        expected = _channel_list(getattr(neck, 'in_channels', None))
        if expected is None:
            return
        key = _path_in_config(model, neck) + '.in_channels'

        def check(module, args, output):
            self._handle.remove()
            outs = output if isinstance(output, (list, tuple)) else [output]
            got = [o.shape[1] for o in outs if isinstance(o, torch.Tensor) and o.dim() >= 2]
            if got != expected:
                indices = getattr(backbone, 'out_indices', None)
                which = f' (out_indices={tuple(indices)})' if indices is not None else ''
                raise ValueError(
                    f'{key}={expected} does not match the backbone: {type(backbone).__name__}{which} outputs '
                    f'{len(got)} feature maps with channels {got}. Set {key}={got} (or change the backbone\'s '
                    f'arch / out_indices).')

        self._handle = backbone.register_forward_hook(check)

    def before_train(self, runner) -> None:
        self._install(runner)

    def before_val(self, runner) -> None:
        self._install(runner)

    def before_test(self, runner) -> None:
        self._install(runner)


@HOOKS.register_module()
class BackboneLayoutHook(Hook):
    """Convert the backbone of a ``load_from`` checkpoint whose backbone is in another layout a converter knows (a
    whole mmdet Swin detector for ReSwin), and refuse one whose backbone fits neither way.

    mmengine loads ``load_from`` with ``strict=False``: without this the backbone of such a file would silently stay
    at its initialisation while the neck and heads load. ``tools/train.py`` adds it.
    """

    priority = 'VERY_HIGH'

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        backbone, state = getattr(model, 'backbone', None), checkpoint.get('state_dict')
        if not isinstance(backbone, torch.nn.Module) or not isinstance(state, dict):
            return
        source = runner.cfg.get('load_from') or 'the checkpoint'
        if not any(k.startswith(('backbone.', 'module.backbone.')) for k in state):
            raise CheckpointMismatchError(
                f"{source} has no 'backbone.' weights (first keys: {', '.join(list(state)[:4])}): the backbone would "
                f"stay at its initialisation. An ImageNet checkpoint of the backbone goes in its init_cfg "
                f"(--cfg-options model.backbone.init_cfg.checkpoint=PATH), not in load_from.")
        try:
            converted = convert_backbone_layout(state, backbone.state_dict().keys())
        except CheckpointMismatchError as error:
            raise CheckpointMismatchError(f'{source}: {error}') from None
        if converted is not None:
            checkpoint['state_dict'], family, layout = converted
            print_log(f'{source}: backbone weights converted from the {layout} layout ({family} converter) for '
                      f'{type(backbone).__name__}.', logger='current')
