"""The staged base of every mmvisatt backbone and what the families share around it.

:class:`AttentionBackbone` owns the mm backbone interface once: preset resolution and validation, drop-path
rates per stage, stage building through one hook (``_make_stage``), output norms, the stage loop (with or without
state carried from stage to stage), input checks, pretrained loading, freezing and the layer order of layer-wise
learning-rate decay. A family file adds its attention, block, stage, presets and converter
(``docs/contributing.md``). :class:`DecayBackbone` is what RMT and EVT share on top.
"""
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
from mmengine.logging import print_log
from mmengine.model import BaseModule
from timm.layers import trunc_normal_
from torch import Tensor
from torch.nn.modules.batchnorm import _BatchNorm

from mmvisatt.checkpoint import load_pretrained, read_checkpoint
from ..layers.attention import resolve_fused_attn

# (module name, whether it is a block): see AttentionBackbone._layer_order
LayerOrder = Iterator[Tuple[str, bool]]


def stage_layer_order(stages: Sequence[nn.Module], name: str = 'stages', before: Sequence[str] = (),
                      after: Sequence[str] = ()) -> LayerOrder:
    """The layer order of stages holding ``blocks``: per stage the modules ``before`` the blocks (patch merging,
    patch embedding), the blocks, then the modules ``after`` them (stage norm, downsampling)."""
    for i, stage in enumerate(stages):
        yield from ((f'{name}.{i}.{m}', False) for m in before)
        yield from ((f'{name}.{i}.blocks.{j}', True) for j in range(len(stage.blocks)))
        yield from ((f'{name}.{i}.{m}', False) for m in after)


def drop_path_rates(rate: float, count: int) -> List[float]:
    """Stochastic depth rising linearly from 0 to ``rate`` over ``count`` blocks (the float32 ``linspace`` every
    official implementation uses). Built on the host whatever the default device: under ``torch.device('meta')``
    (deferred initialisation) a meta tensor has no values to read."""
    return torch.linspace(0, rate, count, device='cpu').tolist()


def stage_drop_paths(rate: float, depths: Sequence[int]) -> List[List[float]]:
    """:func:`drop_path_rates` over all ``sum(depths)`` blocks, cut into one list per stage."""
    rates = drop_path_rates(rate, sum(depths))
    return [rates[sum(depths[:i]):sum(depths[:i + 1])] for i in range(len(depths))]


def init_transformer_weights(model: nn.Module, extra: Optional[Callable[[nn.Module], None]] = None) -> None:
    """The ViT / Swin initialisation every family starts from: truncated-normal linear weights (std 0.02), zero
    biases, unit LayerNorms; ``extra(module)`` initialises what a family adds (position tables, convs)."""
    for m in model.modules():
        if isinstance(m, nn.Linear):
            trunc_normal_(m.weight, std=.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
        elif extra is not None:
            extra(m)


class AttentionBackbone(BaseModule):
    """What every mmvisatt backbone shares: arch presets, input checks, loud pretrained loading and ``train``
    with frozen stages / norm_eval.

    Subclasses set ``arch_zoo``, ``_arch_keys`` (keys an arch dict must have), ``_per_stage_keys`` (arch entries
    that give one value per stage of ``depths``, checked here), ``_arch_prefix`` (the
    family-qualified preset prefix and checkpoint family, e.g. ``'reswin'``), ``not_in_pretrained`` (patterns of
    parameters an official checkpoint does not have, such as dense-task output norms), ``in_channels``,
    ``frozen_stages``, ``norm_eval`` and ``min_input_size`` (smallest input side the stem accepts); say what
    ``frozen_stages`` counts where it is not ``stages`` (``_stem``, ``_frozen_units``, ``_stage_norms``);
    implement ``_layer_order`` (for layer-wise learning-rate decay) and, where the family initialises more than
    linear layers and norms, ``_default_init``. ``static_export_reason`` says why ONNX export must fix the input
    height and width (None: they can be dynamic).
    """
    arch_zoo: Dict[str, dict] = {}
    _arch_keys: Tuple[str, ...] = ()
    _per_stage_keys: Tuple[str, ...] = ()
    _arch_prefix = ''
    _arch_aliases = {'tiny': 't', 'small': 's', 'base': 'b', 'large': 'l'}
    not_in_pretrained: Tuple[str, ...] = ()
    static_export_reason: Optional[str] = None
    # the registry type that builds this very class, where that is not its name (not inherited: a subclass is
    # registered under its own name)
    _registered_as: Optional[str] = None

    @property
    def min_input_size(self) -> int:
        return self.patch_size

    @classmethod
    def _resolve_arch(cls, arch: Union[str, dict]) -> dict:
        if isinstance(arch, dict):
            missing = set(cls._arch_keys) - set(arch)
            if missing:
                raise ValueError(f'arch dict needs {sorted(missing)}')
            return cls._check_per_stage(dict(arch))
        key = arch.lower()
        for sep in '_-':
            key = key.replace(cls._arch_prefix + sep, '')
        key = cls._arch_aliases.get(key, key)
        if key not in cls.arch_zoo:
            names = [k for k, v in cls._arch_aliases.items() if v in cls.arch_zoo]
            registered = cls.__dict__.get('_registered_as') or cls.__name__
            raise ValueError(f"Unknown {registered} arch '{arch}'; choose one of "
                             f"{sorted(cls.arch_zoo)} (or {cls._arch_prefix}_{'/'.join(cls.arch_zoo)}, "
                             f"{'/'.join(names)}) or pass a dict.")
        return cls._check_per_stage(dict(cls.arch_zoo[key]))

    @classmethod
    def _check_per_stage(cls, arch: dict) -> dict:
        """Every sequence in ``_per_stage_keys`` has one value per stage of ``depths`` (an int is a family's own
        rule, e.g. MViTv2's doubling)."""
        depths = arch.get('depths')
        for key in cls._per_stage_keys if isinstance(depths, (list, tuple)) else ():
            value = arch.get(key)
            if isinstance(value, (list, tuple)) and len(value) != len(depths):
                raise ValueError(f'arch {key} needs one entry per stage (one value per stage of depths '
                                 f'{tuple(depths)}), got {tuple(value)}')
        return arch

    def _set_interface(self, in_channels: int, out_indices: Sequence[int], num_outputs: int, frozen_stages: int,
                       norm_eval: bool) -> None:
        """The attributes of mmdet's / mmseg's backbone interface, set in one place (``out_indices`` checked against
        the ``num_outputs`` outputs the backbone can give)."""
        self.in_channels = in_channels
        self.out_indices = self._check_out_indices(out_indices, num_outputs)
        self.frozen_stages = frozen_stages
        self.norm_eval = norm_eval

    @staticmethod
    def _check_out_indices(out_indices: Sequence[int], num_outputs: int) -> Tuple[int, ...]:
        if any(not -num_outputs <= i < num_outputs for i in out_indices):
            raise ValueError(f'out_indices {tuple(out_indices)} out of range for {num_outputs} outputs')
        return tuple(i % num_outputs for i in out_indices)

    def init_weights(self):
        """A ``Pretrained`` ``init_cfg`` loads through the family's converter (named as the arch prefix), another
        ``init_cfg`` runs as mmengine's; without one the family's own initialisation."""
        if not self._init_from_cfg(self._arch_prefix):
            self._default_init()

    def _default_init(self) -> None:
        init_transformer_weights(self)

    def _init_from_cfg(self, family: str) -> bool:
        """Run a ``Pretrained`` (through the family converter and load report) or other mmengine ``init_cfg``.

        Returns False when there is no ``init_cfg`` and the backbone should initialise itself.
        """
        if isinstance(self.init_cfg, dict) and self.init_cfg.get('type') == 'Pretrained':
            load_pretrained(self, self.init_cfg['checkpoint'], family=family, allow_missing=self.not_in_pretrained)
            self._is_init = True
            return True
        if self.init_cfg is not None:
            super().init_weights()
            return True
        return False

    def _check_input(self, x: Tensor) -> None:
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(f'{type(self).__name__} expects images of shape (B, {self.in_channels}, H, W), got '
                             f'{tuple(x.shape)}; set in_channels={x.shape[1] if x.dim() == 4 else "?"} in the '
                             f'backbone config if the data really has that many channels.')
        if min(x.shape[-2:]) < self.min_input_size:
            raise ValueError(f'{type(self).__name__} needs images of at least {self.min_input_size}x'
                             f'{self.min_input_size} pixels (its stem), got {tuple(x.shape[-2:])}; '
                             f'resize or pad the input.')

    # what frozen_stages freezes: the stem (module or parameter names) from 0 on, then the first frozen_stages
    # entries of the module list named by _frozen_units, with their output norms norm{i} where the outputs are
    # the stages' (not a pyramid's levels)
    _stem: Tuple[str, ...] = ('patch_embed', )
    _frozen_units = 'stages'
    _stage_norms = True

    out_norms = True  # families where the output norms are optional set it from their argument
    # the stages hand state on (``stage(x, carried, alpha) -> (x, carried)``: the ReViT family's residual scores)
    _stage_carries = False

    def _build_stages(self, depths: Sequence[int], drop_path_rate: float, **settings) -> None:
        """``stages``: stage i from ``_make_stage(i, its drop-path rates, **settings)``, the rates rising linearly
        over all blocks."""
        self.stages = nn.ModuleList(
            self._make_stage(i, rates, **settings) for i, rates in enumerate(stage_drop_paths(drop_path_rate, depths)))

    def _make_stage(self, index: int, drop_path: List[float], **settings) -> nn.Module:
        """The family's stage ``index`` with per-block drop-path rates ``drop_path``."""
        raise NotImplementedError

    def _add_output_norms(self, widths: Optional[Sequence[int]] = None, eps: float = 1e-5) -> None:
        """A LayerNorm ``norm{i}`` for every output in ``out_indices`` (``widths``: ``num_features``), unless
        ``out_norms`` is off."""
        widths = self.num_features if widths is None else widths
        for i in self.out_indices if self.out_norms else ():
            self.add_module(f'norm{i}', nn.LayerNorm(widths[i], eps=eps))

    def _output(self, i: int, x: Tensor) -> Tensor:
        """Output ``i`` from a (B, H, W, C) map: through ``norm{i}`` where there is one, as contiguous NCHW."""
        norm = getattr(self, f'norm{i}', None)
        if norm is not None:
            x = norm(x)
        return x.permute(0, 3, 1, 2).contiguous()

    def _run_stage(self, stage: nn.Module, x: Tensor, carried):
        """One stage: (its output, the next stage's input, the state it hands on)."""
        if self._stage_carries:
            x, carried = stage(x, carried, self.alpha)
        else:
            x = stage(x)
        return x, x, carried

    def _forward_stages(self, x: Tensor) -> Tuple[Tensor, ...]:
        """Run ``stages`` on the stem's output; the outputs of ``out_indices`` (see :meth:`_output`)."""
        carried, outs = None, []
        for i, stage in enumerate(self.stages):
            out, x, carried = self._run_stage(stage, x, carried)
            if i in self.out_indices:
                outs.append(self._output(i, out))
        return tuple(outs)

    def _freeze_stages(self):
        """Keep the stem and the first ``frozen_stages`` stages (blocks of a plain ViT) in eval mode without
        gradients; -1 freezes nothing. A gate every layer shares (the ReViT family's ``alpha``) is frozen from one
        frozen stage on: frozen stages stay frozen only if it does."""
        n = self.frozen_stages
        if n < 0:
            return
        frozen = [self.get_submodule(name) if '.' in name else getattr(self, name) for name in self._stem]
        frozen += list(getattr(self, self._frozen_units))[:n]
        frozen += [getattr(self, f'norm{i}') for i in range(n) if self._stage_norms and hasattr(self, f'norm{i}')]
        self._freeze(frozen)
        alpha = getattr(self, 'alpha', None)
        if n >= 1 and isinstance(alpha, nn.Parameter):
            alpha.requires_grad = False

    def _layer_order(self) -> LayerOrder:
        """The parameterised modules of the pretrained network in forward order, as (name, is a block).

        Every block starts a new layer; other modules share the layer of what ran before them (the stem is layer
        0). Modules left out (output norms and pyramids of dense tasks, residual gates) count as the top layer.
        """
        raise NotImplementedError

    def get_layer_depth(self, param_name: str, prefix: str = '') -> Tuple[int, int]:
        """Layer id of a parameter for layer-wise learning-rate decay, and the number of layer ids.

        mmpretrain's convention (``LearningRateDecayOptimWrapperConstructor`` and mmvisatt's
        ``LayerDecayOptimWrapperConstructor`` read it): the stem is 0, the blocks 1..L in forward order, and
        L + 1 = number - 1, the top, holds what follows the blocks or is new for the task: parameters named
        without ``prefix`` (necks, heads), output norms, pyramids, residual gates. The learning-rate scale is
        ``decay_rate ** (number - 1 - id)``.
        """
        ids = self.__dict__.get('_layer_ids')
        if ids is None:
            ids, layer = {}, 0
            for name, is_block in self._layer_order():
                layer += int(is_block)
                ids[name] = layer
            self._layer_ids = ids
        num_layers = max(ids.values(), default=0) + 2
        if param_name.startswith(prefix):
            parts = param_name[len(prefix):].split('.')
            for end in range(len(parts), 0, -1):
                layer = ids.get('.'.join(parts[:end]))
                if layer is not None:
                    return layer, num_layers
        return num_layers - 1, num_layers

    @staticmethod
    def _freeze(modules: Sequence[Union[nn.Module, nn.Parameter]]) -> None:
        for module in modules:
            if isinstance(module, nn.Parameter):
                module.requires_grad = False
                continue
            module.eval()
            for p in module.parameters():
                p.requires_grad = False

    def train(self, mode: bool = True):
        super().train(mode)
        self._freeze_stages()
        if mode and self.norm_eval:
            for m in self.modules():
                if isinstance(m, (_BatchNorm, nn.GroupNorm, nn.LayerNorm)):
                    m.eval()
        return self


class DecayBackbone(AttentionBackbone):
    """What RMT and EVT share: building from a preset, stage loop with output norms, freezing, init, loading."""
    _arch_keys = ('embed_dims', 'depths', 'num_heads')
    _per_stage_keys = ('embed_dims', 'num_heads', 'mlp_ratios', 'init_values', 'heads_ranges', 'layer_scales')
    # the output norms are the dense tasks' (the official extra_norms); release files have none
    not_in_pretrained = tuple(f'norm{i}.*' for i in range(4))
    # Entries of release files chosen over plain 'model' weights when present (the EMA the papers report).
    _release_keys = ('model_ema', )

    def _build(self, arch: dict, *, in_channels: int, drop_path_rate: Optional[float], layer_init_values: float,
               fused_attn: Optional[bool], out_norms: bool, out_indices: Optional[Sequence[int]], frozen_stages: int,
               norm_eval: bool, with_cp: bool, norm_cfg: Optional[dict]) -> None:
        """Everything from a resolved preset: the interface, the stem (``_make_stem``), the stages
        (``_make_stage``, drop path from the preset unless ``drop_path_rate`` is given) and the output norms."""
        dims = list(arch['embed_dims'])
        self.out_norms = out_norms
        # None = every stage: (0, 1, 2, 3) for the presets, fewer for a shallower arch dict
        out_indices = range(len(dims)) if out_indices is None else out_indices
        self._set_interface(in_channels, out_indices, len(dims), frozen_stages, norm_eval)
        self.num_features = dims
        self.fused_attn = resolve_fused_attn(fused_attn)
        self.patch_embed = self._make_stem(in_channels, dims[0], norm_cfg)
        self._build_stages(arch['depths'], arch['drop_path_rate'] if drop_path_rate is None else drop_path_rate,
                           arch=arch, layer_init_values=layer_init_values, with_cp=with_cp, norm_cfg=norm_cfg)
        self._add_output_norms()
        self._freeze_stages()

    def _make_stem(self, in_channels: int, dim: int, norm_cfg: Optional[dict]) -> nn.Module:
        """The stride-4 stem, channels-last out."""
        raise NotImplementedError

    @classmethod
    def _stage_defaults(cls, num_stages: int) -> dict:
        """What an arch dict may leave out: per-stage settings for ``num_stages`` stages and the drop path."""
        n = num_stages
        return dict(mlp_ratios=(3, ) * n, init_values=(2, ) * n, heads_ranges=(4, ) * n, layer_scales=(False, ) * n,
                    drop_path_rate=0.1)

    @classmethod
    def _resolve_arch(cls, arch: Union[str, dict]) -> dict:
        arch = super()._resolve_arch(arch)
        for key, value in cls._stage_defaults(len(arch['depths'])).items():
            arch.setdefault(key, value)
        return cls._check_per_stage(arch)

    @property
    def min_input_size(self) -> int:
        # a stride-32 cell of a smaller image would be computed from padding more than from pixels
        return 32

    def forward(self, x: Tensor) -> Tuple[Tensor, ...]:
        """(B, C_in, H, W) -> tuple of (B, num_features[i], ceil(H / 2**(i+2)), ceil(W / 2**(i+2)))."""
        self._check_input(x)
        return self._forward_stages(self.patch_embed(x))

    def _run_stage(self, stage: nn.Module, x: Tensor, carried):
        # a stage returns its output and, downsampled, the next stage's input
        out, x = stage(x)
        return out, x, carried

    def _layer_order(self) -> LayerOrder:
        yield 'patch_embed', False
        yield from stage_layer_order(self.stages, after=('downsample', ))

    def _init_from_cfg(self, family: str) -> bool:
        cfg = self.init_cfg
        if isinstance(cfg, dict) and cfg.get('type') == 'Pretrained':
            checkpoint = source = cfg['checkpoint']
            if isinstance(checkpoint, str):
                checkpoint = read_checkpoint(checkpoint)
            weights = select_release_weights(checkpoint, cfg.get('checkpoint_key', self._release_keys))
            load_pretrained(self, weights, family=family, allow_missing=self.not_in_pretrained,
                            source=source if isinstance(source, str) else None)
            self._is_init = True
            return True
        return super()._init_from_cfg(family)


def select_release_weights(checkpoint: dict, keys: Union[str, Sequence[str]]) -> dict:
    """The entry of a training checkpoint to load: the first of ``keys`` present (e.g. ``'model_ema'``), else the
    checkpoint itself (unwrapped later). The RMT/DeiT ``main.py`` saves both ``model`` and ``model_ema``;
    the generic unwrapping would pick ``model``."""
    for key in [keys] if isinstance(keys, str) else keys:
        if isinstance(checkpoint.get(key), dict):
            print_log(f"Using the '{key}' weights of the checkpoint", logger='current')
            return checkpoint[key]
    return checkpoint
