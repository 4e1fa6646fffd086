"""ONNX export of a config's backbone (optionally with its FPN neck), checked against eager PyTorch in onnxruntime.

The export uses the current exporter (``torch.onnx.export(..., dynamo=True)``, opset 18) on the model's fused
inference path. ``docs/deployment.md`` lists what exports with dynamic height and width and what only at a fixed
size, and why.
"""
import importlib.util
import io
import time
from contextlib import redirect_stdout
from typing import List, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn as nn
from mmengine.config import Config
from mmengine.registry import MODELS, DefaultScope, init_default_scope

from mmvisatt.checkpoint import read_checkpoint, unwrap_state_dict
from mmvisatt.checkpoint.fit import drop_pretrained_init
from mmvisatt.checkpoint.loading import load_into
from mmvisatt.models.layers.score_memory import set_score_memory

OPSET = 18
TOLERANCE = 1e-5
INPUT_NAME = 'image'


class ExportError(RuntimeError):
    """The model could not be exported or the exported graph does not match eager PyTorch."""


class BackboneWithNeck(nn.Module):
    """What is exported: ``image`` (B, 3, H, W) -> the backbone's (or the neck's) feature maps, a tuple."""

    def __init__(self, backbone: nn.Module, neck: Optional[nn.Module] = None):
        super().__init__()
        self.backbone = backbone
        self.neck = neck

    def forward(self, image: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        features = tuple(self.backbone(image))
        return tuple(self.neck(features)) if self.neck is not None else features


def build_export_model(config: str, checkpoint: Optional[str] = None, with_neck: bool = False,
                       cfg_options: Optional[dict] = None) -> BackboneWithNeck:
    """The config's backbone (and neck) in eval mode, with ``checkpoint``'s weights: a whole-model mm checkpoint
    (its ``backbone.`` and ``neck.`` entries) or any backbone checkpoint the family converter reads (official,
    timm). Without a checkpoint the weights are the random initialisation, which the check compares just as well.
    """
    cfg = Config.fromfile(config)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    scope = cfg.get('default_scope')
    model_cfg = cfg.get('model') or {}
    if 'backbone' not in model_cfg:
        raise ExportError(f'{config}: the model has no backbone to export (model.type={model_cfg.get("type")!r})')
    if with_neck and not model_cfg.get('neck'):
        raise ExportError(f'{config}: --with-neck given, but the model has no neck (model.type='
                          f'{model_cfg.get("type")!r}); export the backbone alone.')
    drop_pretrained_init(model_cfg)
    backbone_cfg = model_cfg.backbone
    if checkpoint:
        backbone_cfg.init_cfg = dict(type='Pretrained', checkpoint=checkpoint)
    import mmvisatt.models  # noqa: F401  (registers the backbones)
    if scope:
        init_default_scope(scope)
    with DefaultScope.overwrite_default_scope(scope):
        backbone = MODELS.build(backbone_cfg)
        neck = MODELS.build(model_cfg.neck) if with_neck else None
    backbone.init_weights()
    if neck is not None:
        if checkpoint:
            state = unwrap_state_dict(read_checkpoint(checkpoint))
            own = {k[len('neck.'):]: v for k, v in state.items() if k.startswith('neck.')}
            if not own:
                raise ExportError(f"{checkpoint} has no 'neck.' weights (a backbone-only checkpoint?): give the "
                                  'whole trained model\'s checkpoint, or export without --with-neck.')
            load_into(neck, own, source=checkpoint, layout='mm')
        else:
            neck.init_weights()
    return BackboneWithNeck(backbone, neck).eval()


def check_sizes(height: int, width: int) -> List[Tuple[int, int]]:
    """Two sizes besides (height, width) for a dynamic-shape check, about 0.8x and 1.25x: odd (so no multiple of
    any stride), not multiples of 7 (Swin's window) and at least 65 (the dynamic dimensions start at 64)."""
    def near(n: int) -> int:
        n = max(n, 65) | 1
        while n % 7 == 0:
            n += 2
        return n

    return [(near(height * 5 // 4), near(width * 5 // 4)), (near(height * 4 // 5), near(width * 4 // 5))]


def _export(model: nn.Module, image: torch.Tensor, path: str, dynamic: bool) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    dims = {INPUT_NAME: {2: torch.export.Dim('height', min=64, max=8192),
                         3: torch.export.Dim('width', min=64, max=8192)}} if dynamic else None
    # Traced with the math kernel: the CPU flash kernel's output layout differs from what the exporter's own
    # decomposition of attention produces, and views recorded on the one fail on the other.
    with sdpa_kernel([SDPBackend.MATH]), redirect_stdout(io.StringIO()):
        program = torch.onnx.export(model, (image, ), dynamo=True, opset_version=OPSET, input_names=[INPUT_NAME],
                                    dynamic_shapes=dims, verbose=False)
        program.save(path)


def _input_is_dynamic(path: str) -> bool:
    import onnx
    dims = onnx.load(path, load_external_data=False).graph.input[0].type.tensor_type.shape.dim
    return all(d.dim_param and not d.HasField('dim_value') for d in dims[2:])


def compare(path: str, model: nn.Module, sizes: Sequence[Tuple[int, int]], seed: int = 0) -> List[float]:
    """Relative error (max |onnx - eager| / max |eager|, the worst output) at each (height, width)."""
    import onnxruntime as ort
    session = ort.InferenceSession(path, providers=['CPUExecutionProvider'])
    generator = torch.Generator().manual_seed(seed)
    errors = []
    for h, w in sizes:
        image = torch.randn(1, 3, h, w, generator=generator)
        with torch.no_grad():
            expected = [t.numpy() for t in model(image)]
        got = session.run(None, {INPUT_NAME: image.numpy()})
        if len(got) != len(expected):
            raise ExportError(f'{path}: onnxruntime gave {len(got)} outputs at {h}x{w}, eager {len(expected)}')
        errors.append(max(float(np.abs(g - e).max() / max(np.abs(e).max(), 1e-12)) for g, e in zip(got, expected)))
    return errors


class ExportResult(NamedTuple):
    path: str
    dynamic: bool
    static_reason: Optional[str]  # why height and width are fixed, when dynamic was asked for
    errors: List[Tuple[Tuple[int, int], float]]  # (height, width), relative error
    seconds: float

    def line(self, name: str) -> str:
        shapes = 'dynamic H, W' if self.dynamic else 'static'
        if self.static_reason:
            shapes += f' (H and W cannot be dynamic: {self.static_reason})'
        checks = ', '.join(f'{h}x{w} {e:.1e}' for (h, w), e in self.errors)
        return (f'{name} -> {self.path}: opset {OPSET}, {shapes}; onnxruntime vs eager relative error {checks} '
                f'(< {TOLERANCE:g}); {self.seconds:.0f} s')


def _root_cause(err: BaseException) -> str:
    while err.__cause__ is not None:
        err = err.__cause__
    return f'{type(err).__name__}: ' + (str(err).strip().splitlines() or [''])[0][:200]


def export_onnx(model: nn.Module, path: str, height: int, width: int, dynamic: bool = False,
                tolerance: float = TOLERANCE) -> ExportResult:
    """Export ``model`` (image -> tuple of maps) to ``path`` and check it against eager in onnxruntime at
    (height, width) and, when ``dynamic``, at :func:`check_sizes`. A model whose height and width cannot be
    dynamic is exported static, and the result says why. Raises :class:`ExportError` on a mismatch. A ReViT or
    ReMViTv2 backbone is switched to ``score_memory='full'`` first (in place; the same values): the chunked
    strategies loop over row chunks in Python, which an exporter would unroll at the export size."""
    missing = [name for name in ('onnx', 'onnxscript', 'onnxruntime') if importlib.util.find_spec(name) is None]
    if missing:
        raise ExportError(f'ONNX export needs {", ".join(missing)}: pip install "mmvisatt[onnx]" '
                          f'(requirements/onnx.txt)')
    start = time.perf_counter()
    set_score_memory(model, 'full')
    image = torch.randn(1, 3, height, width)
    reason = getattr(getattr(model, 'backbone', model), 'static_export_reason', None) if dynamic else None
    errors = []
    if dynamic and not reason:
        try:
            _export(model, image, path, dynamic=True)
        except Exception as err:  # the exporter raises many types; the static export below decides
            reason = f'the exporter failed with {_root_cause(err)}'
        if not reason and not _input_is_dynamic(path):
            reason = ('the exporter fixed them to the export size (the model branches on the input size, or '
                      'computes with it in Python)')
        if not reason:
            sizes = [(height, width)] + check_sizes(height, width)
            try:
                errors = list(zip(sizes, compare(path, model, sizes)))
            except Exception as err:
                reason = f'onnxruntime failed at another size with {_root_cause(err)}'
            bad = [f'{h}x{w}: {e:.1e}' for (h, w), e in errors[1:] if not e < tolerance]
            if bad and errors[0][1] < tolerance:
                reason = f'the dynamic graph differs from eager at {", ".join(bad)}'
    if not dynamic or reason:
        # a fresh input: a dynamic export marks the dimensions of the tensor it traced as dynamic
        _export(model, torch.randn(1, 3, height, width), path, dynamic=False)
        errors = list(zip([(height, width)], compare(path, model, [(height, width)])))
    bad = [f'{h}x{w}: {e:.1e}' for (h, w), e in errors if not e < tolerance]
    if bad:
        raise ExportError(f'{path}: onnxruntime differs from eager PyTorch by more than {tolerance:g} '
                          f'(relative) at {", ".join(bad)}')
    return ExportResult(path, dynamic and not reason, reason, errors, time.perf_counter() - start)


def latency(path: str, model: nn.Module, height: int, width: int, runs: int = 3) -> Tuple[float, float]:
    """Median seconds of one batch-1 forward at (height, width): (eager PyTorch, onnxruntime on the CPU), after
    one warm-up run each, in this process (both use every core the process may use)."""
    import onnxruntime as ort
    image = torch.randn(1, 3, height, width)
    session = ort.InferenceSession(path, providers=['CPUExecutionProvider'])
    feed = {INPUT_NAME: image.numpy()}

    def median(fn) -> float:
        fn()
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return float(np.median(times))

    with torch.no_grad():
        eager = median(lambda: model(image))
    return eager, median(lambda: session.run(None, feed))
