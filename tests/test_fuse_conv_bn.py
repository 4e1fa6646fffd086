"""The deployment step that folds the conv stems' BatchNorms: the model code has one form of every residual (the
literal sum), and ``mmcv.cnn.fuse_conv_bn`` is the explicit, one-off way to fold RMT/EVT's conv-BN pairs for
inference.
"""
import pytest
import torch
from mmcv.cnn import fuse_conv_bn

from mmvisatt.models.backbones import EVT, RMT, ShuntedTransformer


@pytest.mark.parametrize('cls,arch', [
    (RMT, dict(embed_dims=(16, 32, 32, 64), depths=(1, 1, 1, 1), num_heads=(2, 2, 4, 4))),
    (EVT, dict(embed_dims=(16, 32, 32, 64), depths=(2, 1, 1, 1), num_heads=(2, 2, 4, 4))),
    (ShuntedTransformer, dict(embed_dims=(16, 32, 32, 64), depths=(1, 1, 1, 1), num_heads=(2, 2, 4, 4),
                              mlp_ratios=(2, 2, 2, 2), sr_ratios=(8, 4, 2, 1))),
], ids=['RMT', 'EVT', 'Shunted'])
def test_fuse_conv_bn_folds_the_stem_and_downsampling_norms(cls, arch):
    """Deployment: ``fuse_conv_bn`` replaces every BatchNorm that follows a conv by the folded conv, in eval mode
    (running statistics away from (0, 1)), with the outputs unchanged."""
    torch.manual_seed(0)
    model = cls(arch=arch).double().eval()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
    x = torch.randn(1, 3, 70, 45, dtype=torch.float64)
    with torch.no_grad():
        expected = model(x)
        fused = fuse_conv_bn(model)
        outs = fused(x)
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in fused.modules())
    for out, ref in zip(outs, expected):
        torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
