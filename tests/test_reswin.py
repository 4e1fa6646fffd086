"""ReSwinTransformer: equivalence with Swin at alpha = 1, shapes, training switches and input errors."""
import importlib
import json
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from mmvisatt.checkpoint import convert_state_dict, load_into
from mmvisatt.models.backbones import ReSwinTransformer
from mmvisatt.models.layers.window import WindowGrid, partition_windows

TINY = dict(embed_dims=16, depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8))


def _load_timm_weights(model: ReSwinTransformer, timm_model: nn.Module) -> None:
    converted, _, layout = convert_state_dict(timm_model.state_dict(), 'reswin')
    assert layout == 'timm-swin'
    backbone = {k[len('backbone.'):]: v for k, v in converted.items() if k.startswith('backbone.')}
    load_into(model, backbone, source='timm', layout=layout, allow_missing=ReSwinTransformer.not_in_pretrained)


def _stage_outputs(module: nn.Module, stages, x: torch.Tensor, nhwc: bool = True):
    captured = []
    handles = [s.register_forward_hook(lambda m, a, out: captured.append(out[0] if isinstance(out, tuple) else out))
               for s in stages]
    with torch.no_grad():
        module(x)
    for h in handles:
        h.remove()
    return [c.permute(0, 3, 1, 2) if nhwc else c for c in captured]


def test_alpha_one_equals_timm_swin_tiny():
    timm = importlib.import_module('timm')
    torch.manual_seed(0)
    reference = timm.create_model('swin_tiny_patch4_window7_224', pretrained=False).double().eval()
    with torch.no_grad():  # no component close to identity
        for p in reference.parameters():
            p.add_(torch.randn_like(p) * (0.02 if p.dim() > 1 else 0.1))
    model = ReSwinTransformer(arch='t', residual_mode='aligned').double().eval()
    _load_timm_weights(model, reference)
    with torch.no_grad():
        model.alpha.fill_(1.0)
    x = torch.randn(1, 3, 224, 224, dtype=torch.float64)
    theirs = _stage_outputs(reference, reference.layers, x)
    ours = _stage_outputs(model, model.stages, x)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert a.shape == b.shape
        assert ((a - b).abs().max() / b.abs().max()).item() < 1e-6, f'stage {i}'
    # and with the residual active the model is no longer plain Swin
    with torch.no_grad():
        model.alpha.fill_(0.5)
    mixed = _stage_outputs(model, model.stages, x)
    assert ((mixed[-1] - theirs[-1]).abs().max() / theirs[-1].abs().max()).item() > 1e-3


@pytest.mark.parametrize('mode', ['aligned', 'official'])
@pytest.mark.parametrize('out_indices', [(0, 1, 2, 3), (0, ), (1, ), (2, ), (3, ), (1, 3)])
def test_any_input_size(mode, out_indices):
    model = ReSwinTransformer(arch=TINY, residual_mode=mode, out_indices=out_indices).eval()
    with torch.no_grad():
        outs = model(torch.randn(1, 3, 333, 517))
    assert len(outs) == len(out_indices)
    h, w = 333, 517
    sizes = []
    h, w = -(-h // 4), -(-w // 4)
    for _ in range(4):
        sizes.append((h, w))
        h, w = -(-h // 2), -(-w // 2)
    for out, i in zip(outs, out_indices):
        assert tuple(out.shape) == (1, 16 * 2 ** i, *sizes[i])
        assert torch.isfinite(out).all()


def test_padding_does_not_leak_into_real_tokens():
    """Padded tokens are masked as keys: whatever they hold, real tokens' outputs do not change."""
    torch.manual_seed(0)
    model = ReSwinTransformer(arch=dict(embed_dims=16, depths=(2, ), num_heads=(2, )), out_indices=(0, ))
    model.init_weights()
    model.eval()
    x = torch.randn(1, 3, 36, 48)  # 9x12 tokens -> padded to 14x14, both blocks (W-MSA and SW-MSA) see padding
    with torch.no_grad():
        reference = model(x)[0]

    def scramble_padding(module, args):
        windows = args[0]
        grid_tokens = torch.zeros(1, 14, 14, 1)
        grid_tokens[:, 9:] = 1
        grid_tokens[:, :, 12:] = 1
        shift = module.shift_for_test
        pad = partition_windows(grid_tokens, WindowGrid(14, 14, 14, 14, 7, shift))
        return (torch.where(pad.bool(), torch.randn_like(windows) * 10, windows), *args[1:])

    for block in model.stages[0].blocks:
        block.attn.shift_for_test = block.shift
        block.attn.register_forward_pre_hook(scramble_padding)
    with torch.no_grad():
        scrambled = model(x)[0]
    assert torch.allclose(reference, scrambled, atol=1e-5)


def test_parameter_count_matches_official():
    counts = json.loads((Path(__file__).parent / 'data/parity/revit/param_counts.json').read_text())
    official = counts['variants']['ReSwin-T']['num_params']
    for mode, extra in (('official', 0), ('aligned', 1)):
        backbone = ReSwinTransformer(arch='t', residual_mode=mode, out_indices=(3, ))
        head = nn.Linear(768, 1000)
        total = sum(p.numel() for p in backbone.parameters()) + sum(p.numel() for p in head.parameters())
        assert total == official + extra


def test_arch_presets():
    for arch, width, blocks in (('t', 96, 12), ('reswin_s', 96, 24), ('base', 128, 24)):
        model = ReSwinTransformer(arch=arch)
        assert model.num_features[0] == width
        assert sum(len(s.blocks) for s in model.stages) == blocks
    with pytest.raises(ValueError, match="Unknown ReSwinTransformer arch 'x'.*'b', 's', 't'"):
        ReSwinTransformer(arch='x')


def test_input_errors():
    model = ReSwinTransformer(arch=TINY)
    with pytest.raises(ValueError, match=r'expects images of shape \(B, 3, H, W\).*in_channels=1'):
        model(torch.randn(1, 1, 64, 64))
    with pytest.raises(ValueError, match='at least 4x4 pixels'):
        model(torch.randn(1, 3, 2, 64))
    with pytest.raises(ValueError, match='residual_mode'):
        ReSwinTransformer(arch=TINY, residual_mode='bogus')


def test_frozen_stages_and_norm_eval():
    model = ReSwinTransformer(arch=TINY, frozen_stages=2, norm_eval=True)
    model.train()
    assert not any(p.requires_grad for p in model.patch_embed.parameters())
    assert not any(p.requires_grad for p in model.stages[1].parameters())
    assert all(p.requires_grad for p in model.stages[2].parameters())
    assert not model.norm0.weight.requires_grad and model.norm2.weight.requires_grad
    assert not model.alpha.requires_grad
    assert not model.stages[0].training and model.stages[2].blocks[0].training
    assert not model.norm3.training  # norm_eval
    model = ReSwinTransformer(arch=TINY, frozen_stages=0)
    assert model.alpha.requires_grad and model.stages[0].blocks[0].attn.qkv.weight.requires_grad


def test_alpha_gets_gradient_and_is_one_scalar():
    model = ReSwinTransformer(arch=TINY)
    assert [n for n, p in model.named_parameters() if p.numel() == 1] == ['alpha']
    assert model.alpha.item() == 0.5
    assert not hasattr(ReSwinTransformer(arch=TINY, residual_mode='official'), 'alpha') or \
        not isinstance(ReSwinTransformer(arch=TINY, residual_mode='official').alpha, nn.Parameter)
