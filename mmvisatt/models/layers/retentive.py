"""The convolutional parts of RMT's network that EVT reuses: the 4-conv stem, the strided-conv downsampling and the
block (CPE, attention, FFN) around any attention module; and RMT's FFN with a depthwise conv. All channels-last
(B, H, W, C).

For deployment, ``mmcv.cnn.fuse_conv_bn(model)`` folds the stem's and the downsampling's BatchNorms into their
convolutions (eval mode; same outputs).
"""
from typing import Optional

import torch
import torch.nn as nn
from mmcv.cnn import build_norm_layer
from timm.layers import DropPath, Mlp
from torch import Tensor


def _depthwise(conv: nn.Conv2d, x: Tensor) -> Tensor:
    return conv(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)


class ConvFFN(nn.Module):
    """fc1 -> GELU -> h + DWConv3x3(h) -> fc2."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.dwconv = nn.Conv2d(hidden, hidden, 3, 1, 1, groups=hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: Tensor) -> Tensor:
        h = self.act(self.fc1(x))
        return self.fc2(h + _depthwise(self.dwconv, h))


class RetentiveBlock(nn.Module):
    """x += DWConv3x3(x) (CPE); x += ls1 * attn(LN(x)); x += ls2 * FFN(LN(x)).

    ``attn`` is any module called as ``attn(x, *context)`` with the context its stage prepares (MaSA in RMT, EuSA
    in EVT), so the two families share the block. ``conv_ffn`` picks RMT's FFN (:class:`ConvFFN`); EVT's is the
    classic two-layer MLP (timm's ``Mlp``, same ``fc1`` / ``fc2`` names).
    """

    def __init__(self, dim: int, attn: nn.Module, mlp_ratio: float, drop_path: float = 0.,
                 layer_scale: Optional[float] = None, conv_ffn: bool = True):
        super().__init__()
        self.cpe = nn.Conv2d(dim, dim, 3, 1, 1, groups=dim)
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = attn
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        hidden = int(mlp_ratio * dim)
        self.ffn = ConvFFN(dim, hidden) if conv_ffn else Mlp(dim, hidden, act_layer=nn.GELU)
        self.drop_path = DropPath(drop_path) if drop_path > 0. else nn.Identity()
        if layer_scale is not None:
            self.gamma_1 = nn.Parameter(torch.full((dim, ), float(layer_scale)))
            self.gamma_2 = nn.Parameter(torch.full((dim, ), float(layer_scale)))
        else:
            self.gamma_1 = self.gamma_2 = None

    def forward(self, x: Tensor, *context) -> Tensor:
        x = x + _depthwise(self.cpe, x)
        x = x + self._branch(self.attn(self.norm1(x), *context), self.gamma_1)
        return x + self._branch(self.ffn(self.norm2(x)), self.gamma_2)

    def _branch(self, y: Tensor, gamma: Optional[Tensor]) -> Tensor:
        return self.drop_path(y if gamma is None else gamma * y)


class ConvStem(nn.Module):
    """Four 3x3 convs (stride 2, 1, 2, 1; widths C/2, C/2, C, C), each with a BatchNorm (``norm_cfg``, default
    ``BN``; the official dense code uses SyncBN), GELU after the first three: (B, C_in, H, W) ->
    (B, ceil(H/4), ceil(W/4), C)."""

    def __init__(self, in_channels: int, dim: int, norm_cfg: Optional[dict] = None):
        super().__init__()
        half = dim // 2
        layers = []
        for i, (cin, cout, stride) in enumerate([(in_channels, half, 2), (half, half, 1), (half, dim, 2),
                                                 (dim, dim, 1)]):
            layers += [nn.Conv2d(cin, cout, 3, stride, 1), build_norm_layer(norm_cfg or dict(type='BN'), cout)[1]]
            if i < 3:
                layers.append(nn.GELU())
        self.proj = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        # A permuted NCHW map would keep every residual add, norm and projection of the stage working across
        # strides (each add inherits its first operand's layout); one copy here makes the whole stage contiguous.
        return self.proj(x).permute(0, 2, 3, 1).contiguous()


class ConvDownsample(nn.Module):
    """3x3 stride-2 conv + BatchNorm (``norm_cfg``, default ``BN``): (B, H, W, C) -> (B, ceil(H/2), ceil(W/2),
    C_out)."""

    def __init__(self, dim: int, out_dim: int, norm_cfg: Optional[dict] = None):
        super().__init__()
        self.reduction = nn.Conv2d(dim, out_dim, 3, 2, 1)
        self.norm = build_norm_layer(norm_cfg or dict(type='BN'), out_dim)[1]

    def forward(self, x: Tensor) -> Tensor:
        # contiguous channels-last tokens for the next stage, as ConvStem
        return self.norm(self.reduction(x.permute(0, 3, 1, 2))).permute(0, 2, 3, 1).contiguous()
