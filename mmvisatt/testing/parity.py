"""Models equivalent to official implementations, for numerical parity checks (see shared parity contract).

``parity_model(meta, state_dict)`` builds the mmvisatt model described by a fixture's ``meta.json``, loads the
official-layout weights through the public conversion path and returns a module whose forward gives
``{'stages': [NCHW tensors at meta['stage_points']], 'logits': ...}``.
"""
from typing import Callable, Dict, List, Optional

import torch
import torch.nn as nn
from torch import Tensor

from mmvisatt.checkpoint import convert_state_dict, load_into, unwrap_state_dict
from mmvisatt.models.backbones.revit import ReSwinTransformer


class StageTap(nn.Module):
    """Runs a backbone, records the raw outputs of chosen submodules by forward hooks, and adds a linear head.

    Hooks rather than a special forward keep the backbone exactly the module users train.
    """

    def __init__(self, backbone: nn.Module, taps: List[str], to_nchw: Callable[[Tensor], Tensor],
                 head: Optional[nn.Module] = None, pool_index: int = -1):
        super().__init__()
        self.backbone = backbone
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
            self._captured[name] = output[0] if isinstance(output, tuple) else output
        return capture

    def forward(self, images: Tensor) -> Dict[str, object]:
        self._captured.clear()
        feats = self.backbone(images)
        result = {'stages': [self._to_nchw(self._captured[name]) for name in self.taps]}
        if self.head is not None:
            result['logits'] = self.head(feats[self.pool_index].mean(dim=(2, 3)))
        return result


def _reswin_from_official_swin(meta: dict, state_dict: dict) -> nn.Module:
    kw = meta['official_kwargs']
    if kw.get('ape') or not kw.get('patch_norm', True) or kw.get('head_dim') not in (None, ):
        raise ValueError('ReSwinTransformer supports the official Swin without absolute position embedding, '
                         'with patch norm and head_dim = dim // heads')
    depths = list(kw['depths'])
    backbone = ReSwinTransformer(
        arch=dict(embed_dims=kw['embed_dim'], depths=depths, num_heads=list(kw['num_heads'])),
        in_channels=kw.get('in_chans', 3), patch_size=kw.get('patch_size', 4), window_size=kw['window_size'],
        mlp_ratio=kw.get('mlp_ratio', 4.), qkv_bias=kw.get('qkv_bias', True), residual_mode='official',
        out_indices=tuple(range(len(depths))))
    head = nn.Linear(backbone.num_features[-1], kw['num_classes']) if kw.get('num_classes') else None
    _load_converted(backbone, head, state_dict, 'reswin', allow_missing=ReSwinTransformer.new_keys)
    # the official stage points are the last block of each stage (before the next stage's patch merging)
    taps = [f'stages.{i}.blocks.{d - 1}' for i, d in enumerate(depths)]
    return StageTap(backbone, taps, lambda t: t.permute(0, 3, 1, 2), head).eval()


def _load_converted(backbone: nn.Module, head: Optional[nn.Module], state_dict: dict, family: str,
                    allow_missing=()) -> None:
    converted, _, layout = convert_state_dict(unwrap_state_dict(state_dict), family)
    load_into(backbone, {k[len('backbone.'):]: v for k, v in converted.items() if k.startswith('backbone.')},
              source='parity state dict', layout=layout, allow_missing=allow_missing)
    if head is not None:
        load_into(head, {k[len('head.fc.'):]: v for k, v in converted.items() if k.startswith('head.fc.')},
                  source='parity state dict', layout=layout)


_BUILDERS = {
    ('revit', 'SwinTransformer'): _reswin_from_official_swin,
}


def parity_model(meta: dict, state_dict: dict) -> nn.Module:
    """Build, load and return (in eval mode) the mmvisatt equivalent of the official model in ``meta``."""
    key = (meta['family'], meta['official_class'])
    if key not in _BUILDERS:
        raise NotImplementedError(f"No mmvisatt equivalent of {meta['official_repo']} {meta['official_class']} "
                                  f"yet; supported: {sorted(_BUILDERS)}")
    model = _BUILDERS[key](meta, state_dict)
    return model.eval()
