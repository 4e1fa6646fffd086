"""``torch.compile(backbone)`` matches eager for every backbone class, on tiny architectures.

The suite compiles with the ``aot_eager`` backend: TorchDynamo capture (graph breaks included) and
AOTAutograd's functionalised forward and backward, without Inductor's code generation, which takes a C++
compile per graph and one to six minutes per model on this CPU (18 minutes for all seven, over the suite's
budget). The Inductor run of every backbone stays available on demand, ``MMVISATT_TEST_INDUCTOR=1``; its last
result is in docs/performance.md. Only ReViT runs in the quick tier; the other backbones (10-30 s each here)
are marked slow.
"""
import os

import pytest
import torch

from mmvisatt.models.backbones import EVT, FANHybrid, RMT, ReMViTv2, ReSwinTransformer, ReViT, ShuntedTransformer

TINY = {
    'ReViT': (ReViT, dict(arch=dict(embed_dims=32, depth=3, num_heads=4), img_size=64)),
    # a chunked score strategy (ReViT-B's detection configs): run eagerly between the compiled pieces
    'ReViT-factors': (ReViT, dict(arch=dict(embed_dims=32, depth=3, num_heads=4), img_size=64,
                                  score_memory='factors')),
    'ReSwinTransformer': (ReSwinTransformer, dict(arch=dict(embed_dims=16, depths=(2, 2, 2, 2),
                                                            num_heads=(1, 2, 4, 8)))),
    'ReMViTv2': (ReMViTv2, dict(arch=dict(embed_dims=16, depths=(1, 1, 2, 1), num_heads=1), img_size=64)),
    'RMT': (RMT, dict(arch=dict(embed_dims=(16, 32, 32, 64), depths=(1, 2, 1, 1), num_heads=(2, 2, 4, 4),
                                decomposed=(True, True, False, False), layer_scales=(False, False, True, True)))),
    'EVT': (EVT, dict(arch=dict(embed_dims=(16, 32, 32, 64), depths=(2, 2, 1, 1), num_heads=(2, 2, 4, 4)))),
    'ShuntedTransformer': (ShuntedTransformer, dict(arch=dict(embed_dims=(16, 32, 32, 64), depths=(1, 1, 1, 1),
                                                              num_heads=(2, 2, 2, 4), mlp_ratios=(2, 2, 2, 2),
                                                              sr_ratios=(8, 4, 2, 1)))),
    'FANHybrid': (FANHybrid, dict(arch=dict(form='hybrid', embed_dims=32, depth=3, num_heads=2, stem_depths=(1, 1),
                                            stem_dims=(16, 24), out_block=1, down_channels=40))),
}


def _model(name: str) -> torch.nn.Module:
    cls, kwargs = TINY[name]
    torch.manual_seed(0)
    model = cls(drop_path_rate=0., **kwargs)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def _check_compiled_equals_eager(name: str, backend: str) -> None:
    model = _model(name)
    compiled = torch.compile(model, backend=backend)
    x = torch.randn(2, 3, 64, 64)
    model.eval()
    with torch.no_grad():
        eager_out = model(x)
        compiled_out = compiled(x)
    for a, b in zip(compiled_out, eager_out, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)

    # training: the compiled backward gives the eager gradients
    model.train()
    grads = []
    for run in (model, compiled):
        model.zero_grad(set_to_none=True)
        sum(out.square().mean() for out in run(x)).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for key in grads[0]:
        torch.testing.assert_close(grads[1][key], grads[0][key], rtol=1e-3, atol=1e-4, msg=key)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


# ReViT (about 10 s) stands for all in the default tier; capturing the others takes 10-30 s each.
@pytest.mark.parametrize('name', [pytest.param(name, marks=[] if name == 'ReViT' else [pytest.mark.slow])
                                  for name in TINY])
def test_compile_matches_eager(name):
    _check_compiled_equals_eager(name, 'aot_eager')


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get('MMVISATT_TEST_INDUCTOR'),
                    reason='Inductor compiles take minutes per model: set MMVISATT_TEST_INDUCTOR=1')
@pytest.mark.parametrize('name', list(TINY))
def test_inductor_compile_matches_eager(name):
    _check_compiled_equals_eager(name, 'inductor')
