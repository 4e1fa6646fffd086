"""Whether a whole model's checkpoint fits a model, and the config edits that loading a trained checkpoint needs:
shared by the tools (``tools/test.py``, ``--resume``) and the inference API, so that neither imports the other."""
from typing import Any, Optional

import torch

from .loading import CheckpointMismatchError, convert_backbone_layout


def drop_pretrained_init(node: Any) -> int:
    """Remove every ``init_cfg`` of type ``Pretrained`` in a model config (in place); returns how many."""
    count = 0
    if isinstance(node, dict):
        init = node.get('init_cfg')
        if isinstance(init, dict) and init.get('type') == 'Pretrained':
            node['init_cfg'] = None
            count += 1
        elif isinstance(init, (list, tuple)):
            kept = [i for i in init if not (isinstance(i, dict) and i.get('type') == 'Pretrained')]
            count += len(init) - len(kept)
            node['init_cfg'] = kept or None
        count += sum(drop_pretrained_init(v) for k, v in node.items() if k != 'init_cfg')
    elif isinstance(node, (list, tuple)):
        count += sum(drop_pretrained_init(v) for v in node)
    return count


def weights_fit_problem(model: torch.nn.Module, checkpoint: dict, hint: str = '') -> Optional[str]:
    """Why ``checkpoint`` (a whole model's, ``state_dict`` or flat) does not fit ``model`` (a tensor of the right
    shape for every model key), with ``hint`` appended; None when it fits. mmengine loads test and inference
    checkpoints with ``strict=False`` and would evaluate whatever results."""
    state = checkpoint.get('state_dict', checkpoint)
    state = {k[len('module.'):] if k.startswith('module.') else k: v for k, v in state.items()}
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    mismatched = [f'{k} {tuple(state[k].shape)} in the checkpoint, {tuple(v.shape)} in the model'
                  for k, v in own.items() if k in state and tuple(getattr(state[k], 'shape', ())) != tuple(v.shape)]
    if not missing and not mismatched:
        return None
    lines = []
    if mismatched:
        lines.append(f'{len(mismatched)} tensors of another shape ({"; ".join(mismatched[:3])}'
                     + (f'; and {len(mismatched) - 3} more)' if len(mismatched) > 3 else ')'))
    if missing:
        lines.append(f'{len(missing)} of the model\'s {len(own)} tensors missing ({", ".join(missing[:5])}'
                     + (f', and {len(missing) - 5} more)' if len(missing) > 5 else ')'))
    return ('the checkpoint does not fit the model built from the config: ' + '; '.join(lines)
            + (f'. {hint}' if hint else '') + _foreign_backbone_hint(model, state))


def _foreign_backbone_hint(model: torch.nn.Module, state: dict) -> str:
    """For a checkpoint whose backbone is in another model's layout that a converter knows (a whole mmdet Swin
    detector for a ReSwin config): why it is not converted here, and where it is."""
    backbone = getattr(model, 'backbone', None)
    if not isinstance(backbone, torch.nn.Module):
        return ''
    try:
        converted = convert_backbone_layout(state, backbone.state_dict().keys())
    except CheckpointMismatchError:
        return ''
    if converted is None:
        return ''
    _, family, layout = converted
    # converted, it would be scored as another backbone (e.g. Swin weights under ReSwin's residual attention)
    return (f' Its backbone is in the {layout} layout, another model than this config\'s {type(backbone).__name__}, '
            f'so it is not converted for evaluation or inference: use it with the config it was trained with. To '
            f'fine-tune from it, pass it to tools/train.py as --cfg-options load_from=PATH, which converts the '
            f'backbone ({family} converter).')


def classes_hint(checkpoint: dict, demo: bool) -> str:
    """What the checkpoint was trained for, and whether ``--demo`` is the likely fix, for a mismatch message."""
    classes = (checkpoint.get('meta') or {}).get('dataset_meta', {}).get('classes')
    hint = f'The checkpoint was trained for {len(classes)} classes {tuple(classes)}. ' if classes else ''
    if demo:
        return hint + 'Is it a checkpoint of this config?'
    return hint + 'A checkpoint written by `tools/train.py CONFIG --demo` needs --demo here.'


__all__ = ['weights_fit_problem', 'classes_hint', 'drop_pretrained_init']
