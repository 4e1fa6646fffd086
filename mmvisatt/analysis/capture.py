"""Forward hooks that record what an attention backbone computes, without touching the model.

Two kinds of attention layers are understood, told apart by what their modules hand back:

* window attention (:class:`~mmvisatt.models.backbones.reswin.WindowResidualAttention`, ReSwin): the hook on the
  attention module records the mixed pre-mask scores it returns and the additive mask it was called with; the
  hook on the block around it records the :class:`~mmvisatt.models.layers.residual_attention.WindowScores` the
  block returns, which carries the window partition;
* pooling / global attention (:class:`~mmvisatt.models.layers.pooling_attention.PoolingResidualAttention`,
  ReViT and ReMViTv2): the module returns
  :class:`~mmvisatt.models.layers.residual_attention.PooledScores`, the final scores with their query and key grids.

Records store exactly these tensors; :meth:`probabilities` applies the same mask and softmax the forward applied,
so the probabilities are the ones the model attended with (checked against an explicit forward in the tests).
Token positions are put in input-pixel units: a token of a map with pixel stride ``s`` covers pixels
``[i * s, (i + 1) * s)`` and sits at its centre ``(i + 0.5) * s`` (the convention of
:class:`~mmvisatt.models.layers.residual_attention.TokenGrid`, whose coarse tokens stand for the block of finer
tokens their pooling window starts at).
"""
import inspect
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple, Union

import torch
import torch.nn as nn
from torch import Tensor

from mmvisatt.models.backbones.reswin import WindowResidualAttention
from mmvisatt.models.layers.patch import PatchMerging
from mmvisatt.models.layers.pooling_attention import PoolingResidualAttention
from mmvisatt.models.layers.residual_attention import PooledScores, ScoreFactors, TokenGrid, WindowScores
from mmvisatt.models.layers.window import WindowGrid, window_token_coords

Pair = Tuple[int, int]
SUPPORTED_ATTENTION = (WindowResidualAttention, PoolingResidualAttention)


class UnsupportedModelError(ValueError):
    """The model has no attention module the analysis can read."""


@dataclass
class WindowAttentionRecord:
    """One window-attention layer of one forward.

    ``scores`` (B * num_windows, heads, N, N): the mixed scores before the mask; ``mask`` (num_windows, N, N)
    or None; ``grid`` the partition; ``stride`` the pixel size of one token (y, x).
    """
    name: str
    scores: Tensor
    mask: Optional[Tensor]
    grid: WindowGrid
    stride: Pair

    kind = 'window'

    @property
    def num_heads(self) -> int:
        return self.scores.shape[1]

    @property
    def batch_size(self) -> int:
        return self.scores.shape[0] // self.grid.num_windows

    def probabilities(self) -> Tensor:
        """(B * num_windows, heads, N, N) attention probabilities, as the forward computed them."""
        attn = self.scores
        if self.mask is not None:
            attn = (attn.unflatten(0, (-1, self.grid.num_windows)) + self.mask[None, :, None]).flatten(0, 1)
        return attn.softmax(dim=-1)

    def token_centres(self) -> Tuple[Tensor, Tensor]:
        """Pixel centres (num_windows, N, 2) as (y, x) of every window slot, and (num_windows, N) real-token flags.

        Slots of the padding that completes the last windows are flagged False.
        """
        ys, xs = window_token_coords(self.grid, self.scores.device)
        real = (ys < self.grid.height) & (xs < self.grid.width)
        centres = torch.stack([(ys + 0.5) * self.stride[0], (xs + 0.5) * self.stride[1]], dim=-1)
        return centres.to(self.scores.dtype), real


@dataclass
class PooledAttentionRecord:
    """One pooling- or global-attention layer of one forward.

    ``scores`` (B, heads, Nq, Nk): the final pre-softmax scores; ``q_grid``/``kv_grid`` the row-major query and
    key grids; ``q_stride``/``kv_stride`` their pixel size of one token (y, x).
    """
    name: str
    scores: Tensor
    q_grid: TokenGrid
    kv_grid: TokenGrid
    q_stride: Pair
    kv_stride: Pair

    kind = 'pooled'

    @property
    def num_heads(self) -> int:
        return self.scores.shape[1]

    @property
    def batch_size(self) -> int:
        return self.scores.shape[0]

    @property
    def stride(self) -> Pair:
        return self.q_stride

    def probabilities(self) -> Tensor:
        """(B, heads, Nq, Nk) attention probabilities, as the forward computed them."""
        return self.scores.softmax(dim=-1)

    def query_centres(self) -> Tensor:
        """(Nq, 2) pixel centres (y, x) of the query tokens."""
        return grid_centres(self.q_grid.size, self.q_stride, self.scores.device).to(self.scores.dtype)

    def key_centres(self) -> Tensor:
        """(Nk, 2) pixel centres (y, x) of the key tokens."""
        return grid_centres(self.kv_grid.size, self.kv_stride, self.scores.device).to(self.scores.dtype)


AttentionRecord = Union[WindowAttentionRecord, PooledAttentionRecord]


def grid_centres(size: Pair, stride: Pair, device: Optional[torch.device] = None) -> Tensor:
    """(H * W, 2) row-major pixel centres (y, x) of an H x W token map with the given pixel stride."""
    ys, xs = torch.meshgrid(torch.arange(size[0], device=device), torch.arange(size[1], device=device),
                            indexing='ij')
    return torch.stack([(ys.flatten() + 0.5) * stride[0], (xs.flatten() + 0.5) * stride[1]], dim=-1)


def attention_layers(model: nn.Module) -> List[Tuple[str, nn.Module, str, nn.Module]]:
    """(block name, block, attention name, attention module) of every supported attention layer, in module order.

    The block is the module that owns the attention module: its output is the layer's token map.
    """
    modules = dict(model.named_modules())
    found = []
    for name, module in modules.items():
        if isinstance(module, SUPPORTED_ATTENTION):
            block_name = name.rpartition('.')[0]
            found.append((block_name, modules[block_name], name, module))
    if not found:
        supported = ', '.join(cls.__name__ for cls in SUPPORTED_ATTENTION)
        raise UnsupportedModelError(
            f'{type(model).__name__} has no attention module the analysis can read (looked for {supported}: the '
            f'attention of ReSwinTransformer, ReViT and ReMViTv2). Pass one of those backbones, or a model '
            f'containing one.')
    return found


def find_patch_embed(model: nn.Module) -> Tuple[str, nn.Module, Pair]:
    """The patch embedding (its token map is where token strides start) and its pixel stride (y, x)."""
    for name, module in model.named_modules():
        if name.rpartition('.')[2] == 'patch_embed' and hasattr(module, 'stride'):
            stride = module.stride
            return name, module, (stride, stride) if isinstance(stride, int) else tuple(stride)
    raise UnsupportedModelError(
        f'{type(model).__name__} has no `patch_embed` module with a `stride`: token positions in pixels cannot be '
        f'derived.')


class AttentionCapture:
    """Context manager that records every supported attention layer of each forward of ``model``.

    ``records`` holds the layers of the latest forward(s) in call order; :meth:`clear` empties it. Tensors are
    detached; run the model under ``torch.no_grad()`` and in eval mode (no attention dropout) to analyse it.

    Example::

        with AttentionCapture(backbone) as capture, torch.no_grad():
            backbone(images)
        probs = capture.records[0].probabilities()
    """

    def __init__(self, model: nn.Module):
        self.model = model
        self.layers = attention_layers(model)
        self._patch_name, self._patch_embed, self.patch_stride = find_patch_embed(model)
        self.records: List[AttentionRecord] = []
        self._base: Optional[Pair] = None
        self._merges = 0
        self._pending: Dict[str, dict] = {}
        self._handles: list = []

    def clear(self) -> None:
        self.records = []
        self._pending = {}

    def __enter__(self) -> 'AttentionCapture':
        self._handles.append(self._patch_embed.register_forward_hook(self._on_patch_embed))
        for module in self.model.modules():
            if isinstance(module, PatchMerging):
                self._handles.append(module.register_forward_hook(self._on_patch_merging))
        for block_name, block, attn_name, attn in self.layers:
            if isinstance(attn, WindowResidualAttention):
                signature = inspect.signature(attn.forward)
                self._handles.append(attn.register_forward_hook(
                    self._window_attention_hook(block_name, signature), with_kwargs=True))
                self._handles.append(block.register_forward_hook(self._window_block_hook(block_name)))
            else:
                self._handles.append(attn.register_forward_hook(self._pooled_attention_hook(block_name)))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _on_patch_embed(self, module: nn.Module, args, output: Tensor) -> None:
        if output.dim() != 4:
            raise UnsupportedModelError(f'{self._patch_name} returned shape {tuple(output.shape)}; expected a '
                                        f'channels-last token map (B, H, W, C).')
        self._base = (output.shape[1], output.shape[2])
        self._merges = 0

    def _on_patch_merging(self, module: nn.Module, args, output: Tensor) -> None:
        self._merges += 1

    def _window_attention_hook(self, block_name: str, signature: inspect.Signature):

        def hook(module: nn.Module, args, kwargs, output) -> None:
            bound = signature.bind(*args, **kwargs).arguments
            mask = bound.get('mask')
            self._pending[block_name] = dict(scores=output[1].detach(),
                                             mask=None if mask is None else mask.detach())

        return hook

    def _window_block_hook(self, block_name: str):

        def hook(module: nn.Module, args, output) -> None:
            pending = self._pending.pop(block_name, None)
            carried = output[1] if isinstance(output, tuple) and len(output) > 1 else None
            if pending is None or not isinstance(carried, WindowScores):
                raise UnsupportedModelError(
                    f'{block_name} does not return WindowScores next to its output: the window partition of its '
                    f'attention cannot be read.')
            grid = carried.grid
            self.records.append(WindowAttentionRecord(block_name, pending['scores'], pending['mask'], grid,
                                                      self._window_stride(block_name, grid)))

        return hook

    def _pooled_attention_hook(self, block_name: str):

        def hook(module: nn.Module, args, output) -> None:
            carried = output[1]
            if not isinstance(carried, PooledScores):
                hint = (" Build the model with score_memory='full': attention maps need the score maps, not their "
                        'factors.' if isinstance(carried, ScoreFactors) else '')
                raise UnsupportedModelError(f'{block_name}.attn returned {type(carried).__name__}, not '
                                            f'PooledScores.{hint}')
            if carried.source_q_grid is not None:
                raise UnsupportedModelError(f'{block_name}.attn handed its scores on already reduced for the next '
                                            f"block; build the model with score_memory='full' to capture its "
                                            f'attention maps.')
            py, px = self.patch_stride
            q, kv = carried.q_grid, carried.kv_grid
            self.records.append(
                PooledAttentionRecord(block_name, carried.scores.detach(), q, kv, (py * q.stride_h, px * q.stride_w),
                                      (py * kv.stride_h, px * kv.stride_w)))

        return hook

    def _window_stride(self, block_name: str, grid: WindowGrid) -> Pair:
        # Every 2x2 patch merging since the patch embedding doubles the stride; counting them stays exact where
        # the map sizes cannot tell (a 1x1 map is the end of any number of halvings).
        if self._base is None:
            raise UnsupportedModelError(f'{self._patch_name} did not run before {block_name}.')
        factor = 2 ** self._merges
        expected = (-(-self._base[0] // factor), -(-self._base[1] // factor))
        if expected != (grid.height, grid.width):
            raise UnsupportedModelError(
                f'{block_name} works on a {grid.height}x{grid.width} map, not the {self._base[0]}x{self._base[1]} '
                f'patch map after {self._merges} patch merging(s) ({expected[0]}x{expected[1]}): its token stride '
                f'is unknown.')
        return self.patch_stride[0] * factor, self.patch_stride[1] * factor


class BlockOutputCapture:
    """Context manager that records the token map each attention block returns, (B, H, W, C) or (B, N, C).

    ``outputs`` is a list of (block name, tensor) in call order.
    """

    def __init__(self, model: nn.Module):
        self.layers = attention_layers(model)
        self.outputs: List[Tuple[str, Tensor]] = []
        self._handles: list = []

    def clear(self) -> None:
        self.outputs = []

    def __enter__(self) -> 'BlockOutputCapture':
        for block_name, block, _, _ in self.layers:
            self._handles.append(block.register_forward_hook(self._hook(block_name)))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _hook(self, block_name: str):

        def hook(module: nn.Module, args, output) -> None:
            tokens = output[0] if isinstance(output, tuple) else output
            self.outputs.append((block_name, tokens.detach()))

        return hook
