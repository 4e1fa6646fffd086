"""What every mmvisatt backbone promises, checked once for all of them and every preset form: registration in
mmengine's root MODELS (so a bare name builds under the mmdet, mmseg and mmpretrain scopes), activation
checkpointing that leaves results and BatchNorm statistics unchanged."""
import importlib
import subprocess
import sys

import pytest
import torch
from mmengine.registry import MODELS, DefaultScope

import mmvisatt.models  # noqa: F401

# tiny arch of each backbone, the out_indices to request and the channels they must have
BACKBONES = {
    'ReSwinTransformer': (dict(embed_dims=16, depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8)), (0, 1), [16, 32]),
    'ReMViTv2': (dict(embed_dims=16, depths=(1, 1, 2, 1), num_heads=1), (0, 3), [16, 128]),
    'ReViT': (dict(embed_dims=32, depth=3, num_heads=4), (1, 2), [16, 32]),
    'FAN': (dict(form='hybrid', embed_dims=32, depth=2, num_heads=2, stem_depths=(1, 1), stem_dims=(16, 24),
                 down_channels=48), (1, 3), [24, 48]),
    # the three FAN forms as registered classes (FAN above is the builder that picks one by the arch)
    'FANHybrid': (dict(form='hybrid', embed_dims=32, depth=2, num_heads=2, stem_depths=(1, 1), stem_dims=(16, 24),
                       down_channels=48), (1, 3), [24, 48]),
    'FANViT': (dict(form='vit', embed_dims=32, depth=2, num_heads=2), (1, 2), [16, 32]),
    'FANSwin': (dict(form='swin', embed_dims=16, depths=(1, 2, 1, 1), num_heads=(1, 2, 2, 4)), (0, 3), [16, 128]),
    'ShuntedTransformer': (dict(embed_dims=(16, 32, 32, 64), depths=(1, 1, 1, 1), num_heads=(2, 2, 2, 4),
                                mlp_ratios=(2, 2, 2, 2), sr_ratios=(8, 4, 2, 1)), (0, 3), [16, 64]),
    # three stages: a fourth would be 1x1 at 32 px, where training-mode BatchNorm (conv downsampling) fails
    'RMT': (dict(embed_dims=(16, 32, 64), depths=(1, 1, 1), num_heads=(2, 2, 4)), (0, 2), [16, 64]),
    'EVT': (dict(embed_dims=(16, 32, 64), depths=(2, 1, 1), num_heads=(2, 2, 4)), (1, 2), [32, 64]),
}

# every form a preset can take (the forms BACKBONES leaves out), tiny
FORMS = [(name, arch) for name, (arch, _, _) in sorted(BACKBONES.items())] + [
    ('FAN', dict(form='vit', embed_dims=32, depth=2, num_heads=2)),
    ('FAN', dict(form='swin', embed_dims=16, depths=(1, 2, 1, 1), num_heads=(1, 2, 2, 4))),
    ('EVT', dict(embed_dims=(16, 32, 32, 64), depths=(2, 2, 2, 2), num_heads=(1, 2, 2, 4), style='swin')),
]
FORM_IDS = [f"{name}-{arch.get('form', arch.get('style', 'base'))}" for name, arch in FORMS]


@pytest.mark.parametrize('name', sorted(BACKBONES))
@pytest.mark.parametrize('scope', ['mmdet', 'mmseg', 'mmpretrain'])
def test_bare_name_builds_under_each_default_scope(scope, name):
    lib = importlib.import_module(f'{scope}.registry')
    arch, out_indices, channels = BACKBONES[name]
    with DefaultScope.overwrite_default_scope(scope):
        model = lib.MODELS.build(dict(type=name, arch=arch, out_indices=out_indices))
    # FAN is a builder: it returns the registered class of the arch's form
    form = {'vit': 'FANViT', 'hybrid': 'FANHybrid', 'swin': 'FANSwin'}.get(arch.get('form'))
    assert isinstance(model, MODELS.get(form if name == 'FAN' else name))
    assert [o.shape[1] for o in model(torch.randn(1, 3, 32, 32))] == channels


@pytest.mark.parametrize('name', sorted(BACKBONES))
def test_registered_in_root_registry(name):
    assert MODELS.scope == 'mmengine'
    assert MODELS.get(name) is not None


def _bn_stats(model: torch.nn.Module) -> dict:
    return {name: buf.clone() for name, buf in model.named_buffers()
            if name.rsplit('.', 1)[-1] in ('running_mean', 'running_var', 'num_batches_tracked')}


@pytest.mark.parametrize('name,arch', FORMS, ids=FORM_IDS)
def test_with_cp_same_gradients_and_batchnorm_statistics(name, arch):
    """A training step under ``with_cp`` gives every parameter the gradient of a step without it, and leaves every
    BatchNorm as that step does: ``num_batches_tracked`` advanced by one and the same running statistics (a plain
    checkpoint would update them again when the backward recomputes the block)."""
    cls = MODELS.get(name)
    torch.manual_seed(0)
    plain = cls(arch=arch, drop_path_rate=0.).double()
    ckpt = cls(arch=arch, drop_path_rate=0., with_cp=True).double()
    ckpt.load_state_dict(plain.state_dict())
    before = _bn_stats(plain)
    x = torch.randn(2, 3, 64, 96, dtype=torch.float64)
    grads = []
    for model in (plain, ckpt):
        model.train()
        sum(o.pow(2).mean() for o in model(x)).backward()
        grads.append({n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and any(g.abs().sum() > 0 for g in grads[0].values())
    for n in grads[0]:
        torch.testing.assert_close(grads[1][n], grads[0][n], rtol=1e-9, atol=1e-10, msg=n)
    after, checkpointed = _bn_stats(plain), _bn_stats(ckpt)
    counters = [n for n in before if n.endswith('num_batches_tracked')]
    if name in ('FAN', 'RMT', 'EVT', 'ShuntedTransformer') and arch.get('style') != 'swin':
        assert counters, f'{name} has no BatchNorm to check'
    for n in counters:
        assert after[n] - before[n] == 1
        assert checkpointed[n] - before[n] == 1, f'{n} advanced by {int(checkpointed[n] - before[n])} under with_cp'
    for n in before:
        torch.testing.assert_close(checkpointed[n], after[n], rtol=1e-12, atol=1e-12)


def test_importing_the_models_registers_models_only():
    """``import mmvisatt.models`` (a config's ``custom_imports``) loads no engine, datasets, file backend or safe
    globals; the dataset transforms do not import the engine (no import circle)."""
    code = ('import sys, mmvisatt.models; '
            "loaded = sorted(m for m in sys.modules if m.startswith(('mmvisatt.engine', 'mmvisatt.datasets'))); "
            'assert not loaded, loaded; '
            'import mmvisatt.datasets.transforms; '
            "assert not [m for m in sys.modules if m.startswith('mmvisatt.engine')]")
    subprocess.run([sys.executable, '-c', code], check=True)


def _levels(model) -> int:
    return len(model.num_features)


@pytest.mark.parametrize('name,arch', FORMS, ids=FORM_IDS)
def test_any_input_size_and_any_out_indices(name, arch):
    """Every level, alone or with others, at sizes that divide by nothing: (B, num_features[i], ceil(H / s_i),
    ceil(W / s_i)), s_i the level's stride."""
    cls = MODELS.get(name)
    n = _levels(cls(arch=arch))
    for out_indices in {tuple(range(n)), (n - 1, ), (1, )}:
        model = cls(arch=arch, out_indices=out_indices).eval()
        strides = getattr(model, 'strides', (4, 8, 16, 32))
        for height, width in ((64, 96), (70, 45)):
            with torch.no_grad():
                outs = model(torch.randn(1, 3, height, width))
            assert all(torch.isfinite(o).all() for o in outs)
            assert [tuple(o.shape[1:]) for o in outs] == [
                (model.num_features[i], -(-height // strides[i]), -(-width // strides[i])) for i in out_indices]


@pytest.mark.parametrize('name,arch', FORMS, ids=FORM_IDS)
def test_frozen_stem_and_norm_eval_survive_train(name, arch):
    """``frozen_stages=0`` freezes the stem (no gradients, eval mode) and ``norm_eval`` keeps every normalisation
    layer in eval mode, both through ``model.train()``; the rest trains."""
    model = MODELS.get(name)(arch=arch, frozen_stages=0, norm_eval=True).train()
    stem = dict(model.named_parameters(prefix='')).keys()
    frozen = [n for n in stem if n.startswith(('patch_embed.', 'stages.0.patch_embed.'))]
    assert frozen and all(not p.requires_grad for n, p in model.named_parameters() if n in frozen)
    assert any(p.requires_grad for n, p in model.named_parameters() if n not in frozen)
    norms = [m for m in model.modules() if isinstance(m, (torch.nn.modules.batchnorm._BatchNorm, torch.nn.LayerNorm))]
    assert norms and not any(m.training for m in norms)
    if name == 'ShuntedTransformer':
        assert not model.stages[0].patch_embed.training
    else:
        assert not model.patch_embed.training


@pytest.mark.parametrize('name,arch', FORMS, ids=FORM_IDS)
def test_fused_attn_both_ways_agree(name, arch):
    """The one switch, both ways, on every form."""
    cls = MODELS.get(name)
    torch.manual_seed(0)
    fused = cls(arch=arch, fused_attn=True, drop_path_rate=0.).double().eval()
    reference = cls(arch=arch, fused_attn=False, drop_path_rate=0.).double().eval()
    reference.load_state_dict(fused.state_dict())
    x = torch.randn(1, 3, 70, 45, dtype=torch.float64)
    with torch.no_grad():
        for a, b in zip(fused(x), reference(x)):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)
