"""Layer-wise learning-rate decay for any backbone that reports layer ids, from mmdet, mmseg and mmpretrain configs.

mmdet's and mmseg's layer-decay constructors recognise backbones by class name (ConvNeXt, BEiT, MAE) and
mmpretrain's lives in the mmpretrain scope and drops ``lr_mult``. This one is registered in mmengine's root
registry and asks the backbone for ``get_layer_depth(param_name, prefix='backbone.')`` (mmpretrain's interface,
implemented by every mmvisatt backbone and by mmpretrain's ViT, Swin, ConvNeXt...).
"""
from typing import Callable, List, Optional, Tuple

import torch.nn as nn
from mmengine.logging import print_log
from mmengine.optim import DefaultOptimWrapperConstructor, OptimWrapper
from mmengine.registry import OPTIM_WRAPPER_CONSTRUCTORS

LayerDepth = Callable[[str], Tuple[int, int]]


def _layer_depth_of(model: nn.Module) -> Tuple[LayerDepth, str]:
    """The function giving (layer id, number of layer ids) for a parameter name of ``model``, and what it reads."""
    backbone = getattr(model, 'backbone', None)
    if isinstance(backbone, nn.Module):
        if not hasattr(backbone, 'get_layer_depth'):
            raise TypeError(
                f'LayerDecayOptimWrapperConstructor needs a backbone that reports layer ids '
                f'(get_layer_depth(param_name, prefix)); {type(backbone).__name__} has none. Every mmvisatt backbone '
                f'has it; for another backbone drop `constructor` (and `layer_decay_rate`) from optim_wrapper.')
        return (lambda name: backbone.get_layer_depth(name, prefix='backbone.')), type(backbone).__name__
    if hasattr(model, 'get_layer_depth'):  # a bare backbone
        return model.get_layer_depth, type(model).__name__
    raise TypeError(f'LayerDecayOptimWrapperConstructor needs a model with a `backbone` (or a backbone itself) that '
                    f'has get_layer_depth; {type(model).__name__} has neither.')


@OPTIM_WRAPPER_CONSTRUCTORS.register_module()
class LayerDecayOptimWrapperConstructor(DefaultOptimWrapperConstructor):
    """mmengine's default constructor, with every learning rate scaled by the depth of its parameter.

    A parameter of backbone layer ``i`` out of ``n`` layer ids trains at ``lr * layer_decay_rate ** (n - 1 - i)``
    (the stem slowest, the last block at ``lr * rate``); parameters outside the backbone (necks, heads) and the
    backbone's new dense-task modules are in the top layer and keep ``lr``. Everything else of
    ``paramwise_cfg`` (``custom_keys`` with ``lr_mult`` / ``decay_mult``, ``norm_decay_mult``,
    ``bias_decay_mult``, ``flat_decay_mult``, ...) works as in the default constructor and combines with the
    layer scale. Each parameter group records ``layer_id`` and ``lr_scale``.

    Example::

        optim_wrapper = dict(
            optimizer=dict(type='AdamW', lr=2e-4, weight_decay=0.05),
            constructor='LayerDecayOptimWrapperConstructor',
            paramwise_cfg=dict(layer_decay_rate=0.7, norm_decay_mult=0., flat_decay_mult=0.,
                               custom_keys={'relative_position_bias_table': dict(decay_mult=0.)}))
    """

    def __init__(self, optim_wrapper_cfg: dict, paramwise_cfg: Optional[dict] = None):
        super().__init__(optim_wrapper_cfg, paramwise_cfg)
        rate = self.paramwise_cfg.get('layer_decay_rate')
        if rate is None:
            raise ValueError('LayerDecayOptimWrapperConstructor needs paramwise_cfg=dict(layer_decay_rate=...), '
                             'e.g. 0.7 (1.0 turns the decay off)')
        if not 0 < rate <= 1:
            raise ValueError(f'layer_decay_rate must be in (0, 1], got {rate}')
        if self.base_lr is None:
            raise ValueError('LayerDecayOptimWrapperConstructor needs optimizer.lr to scale')
        self.layer_decay_rate = float(rate)
        self._layer_depth: Optional[LayerDepth] = None
        self._owner = ''
        self._names = {}

    def __call__(self, model: nn.Module) -> OptimWrapper:
        if hasattr(model, 'module'):  # DDP and mmengine's model wrappers
            model = model.module
        self._layer_depth, self._owner = _layer_depth_of(model)
        self._names = {id(p): name for name, p in model.named_parameters()}
        try:
            return super().__call__(model)
        finally:
            self._layer_depth, self._names = None, {}

    def add_params(self, params: List[dict], module: nn.Module, prefix: str = '', **kwargs) -> None:
        super().add_params(params, module, prefix, **kwargs)
        if prefix:
            return
        # the top call returns after the recursion over all submodules: every group is there
        for group in params:
            layer_id, num_layers = self._layer_depth(self._names[id(group['params'][0])])
            scale = self.layer_decay_rate ** (num_layers - 1 - layer_id)
            group['lr'] = group.get('lr', self.base_lr) * scale
            group['lr_scale'] = scale
            group['layer_id'] = layer_id
        if params:
            print_log(f'Layer-wise lr decay {self.layer_decay_rate} over the {num_layers} layer ids of '
                      f'{self._owner}: lr scale {min(g["lr_scale"] for g in params):.3g} (stem) to 1 (top)',
                      logger='current')
