"""The model zoo: parameters and FLOPs of every task config, measured, beside the numbers the papers report.

    python tools/analysis/model_zoo.py [--configs GLOB] [--out docs/model_zoo.md] [--json] [--no-flops]

What is counted (the document repeats it):

- parameters: ``sum(p.numel())`` over the model built from the config (all of them, trainable or not) and over
  its ``backbone``;
- FLOPs: ``torch.utils.flop_counter.FlopCounterMode`` over one inference forward (``mode='tensor'``, batch 1) at
  the task's resolution: detection 1280x800 (input 800x1280), segmentation 2048x512 (input 512x2048),
  classification 224x224. The counter sees matrix products (``mm``, ``addmm``, ``bmm``, ``baddbmm``, attention
  decomposed into them) and convolutions; element-wise ops, norms, softmax, pooling, interpolation and RoIAlign
  are not counted. The counter's FLOPs are 2 per multiply-add; the tables give multiply-adds (GMACs), the unit
  the papers call "FLOPs". FLOPs depend only on shapes, so the forward runs on the ``meta`` device (no arithmetic;
  attention is reduced to ``bmm`` there, and the CPU's fused attention kernel is counted too, so a real forward
  gives the same number). Two-stage detectors: the RoI heads are counted on 1000 proposals with mask heads on the
  first 100, the convention of mmdet 2's ``forward_dummy`` that the papers' FLOPs follow; they run for real on
  zero features (RoIAlign has no meta kernel) on a few RoIs and are scaled by the RoI count (see
  ``_roi_head_macs``). The RPN / dense heads are counted up to their raw outputs (no NMS).

Measurements are cached in a JSON file keyed by config name and a hash of the resolved config text, so a rerun
measures only new or changed configs.
"""
import datetime
import fnmatch
import glob
import hashlib
import json
import os
import os.path as osp
import platform
import time
from dataclasses import asdict, dataclass, fields
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
from mmengine.config import Config
from mmengine.model import revert_sync_batchnorm
from mmengine.registry import MODELS, DefaultScope, init_default_scope
from torch.overrides import TorchFunctionMode
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from mmvisatt.task_configs import RECIPES, backbone_tokens, recipe_key, recipe_scope

# Bump when what is measured changes: cached entries of another version are measured again.
MEASURE_VERSION = 2

# (height, width) of the measured input per library, and how the papers write it
TASK_INPUTS: Dict[str, Tuple[int, int]] = {'mmdet': (800, 1280), 'mmseg': (512, 2048), 'mmpretrain': (224, 224)}
TASK_RESOLUTION = {'mmdet': '1280x800', 'mmseg': '2048x512', 'mmpretrain': '224x224'}
NUM_PROPOSALS = 1000
MASK_ROIS = 100

REPO_ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
CONFIG_DIR = osp.join(REPO_ROOT, 'configs')


class ModelZooError(ValueError):
    """A config the zoo cannot place (not a generated task config) or a bad option."""


@dataclass
class Measurement:
    """One config's measured numbers. ``macs`` / ``backbone_macs`` are multiply-adds (None: not measured)."""
    config: str
    token: str
    recipe: str
    scope: str
    config_hash: str
    params: int
    backbone_params: int
    input_hw: Tuple[int, int]
    macs: Optional[int] = None
    backbone_macs: Optional[int] = None
    flops_seconds: Optional[float] = None
    version: int = MEASURE_VERSION

    @classmethod
    def from_json(cls, data: dict) -> 'Measurement':
        known = {f.name for f in fields(cls)}
        data = {k: v for k, v in data.items() if k in known}
        data['input_hw'] = tuple(data['input_hw'])
        return cls(**data)


# --------------------------------------------------------------------------------------------- configs


def discover_configs(config_dir: str = CONFIG_DIR, patterns: Union[str, Sequence[str]] = '*.py') -> List[str]:
    """The task configs in ``config_dir`` (flat, as generated) whose file name matches any of ``patterns``."""
    patterns = [patterns] if isinstance(patterns, str) else list(patterns)
    paths = sorted(p for p in glob.glob(osp.join(config_dir, '*.py'))
                   if any(fnmatch.fnmatch(osp.basename(p), osp.basename(pat)) for pat in patterns))
    if not paths:
        raise ModelZooError(f'no config in {config_dir} matches {patterns}; pass file-name globs such as '
                            "'mask_rcnn_*_1x.py' or 'imagenet_rmt_*'")
    return paths


def identify(path: str, config_dir: Optional[str] = None) -> Tuple[str, str]:
    """(backbone token, recipe key) of a generated task config, e.g. ('rmt_t', 'mask_rcnn_1x')."""
    config_dir = config_dir or osp.dirname(osp.abspath(path))
    name = osp.basename(path)[:-3]
    tokens = backbone_tokens(config_dir) if osp.isdir(osp.join(config_dir, '_base_', 'backbones')) else []
    for token in tokens:
        for recipe in RECIPES:
            if recipe.name.format(bb=token) == name:
                return token, recipe_key(recipe)
    raise ModelZooError(f'{path} is not a generated task config ({{recipe}}_{{backbone}}... from '
                        'mmvisatt/task_configs.py); the zoo measures only those')


def _recipe(key: str):
    return next(r for r in RECIPES if recipe_key(r) == key)


def load_config(path: str) -> Config:
    """The config as the zoo builds it: no pretrained weights (nothing to download, counts do not depend on
    them) and, for mmpretrain, the data preprocessor the Runner would add."""
    cfg = Config.fromfile(path)
    cfg.model.backbone.init_cfg = None
    if cfg.get('data_preprocessor'):
        cfg.model.setdefault('data_preprocessor', cfg.data_preprocessor)
    return cfg


def config_hash(cfg: Config) -> str:
    """Hash of the resolved model config (bases included): what the measurements depend on, so a change of the
    model in any base invalidates the cache and a change of hooks or schedules does not. (Not ``pretty_text``:
    formatting it takes seconds per config.)"""
    text = json.dumps(cfg.to_dict().get('model'), sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class _ZeroInit(TorchFunctionMode):
    """Random initialisers write zeros instead: counting needs shapes, not values, and drawing the random numbers
    of a 100M-parameter detector is most of its build time. Zeros (not uninitialised memory) keep the RoI heads,
    which run for real, free of NaNs."""
    RANDOM_FILLS = (torch.Tensor.uniform_, torch.Tensor.normal_, torch.Tensor.random_, torch.Tensor.erfinv_,
                    torch.Tensor.bernoulli_, torch.Tensor.exponential_, torch.Tensor.log_normal_,
                    torch.Tensor.cauchy_, torch.Tensor.geometric_)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in self.RANDOM_FILLS:
            return args[0].zero_()
        return func(*args, **(kwargs or {}))


def build_model(cfg: Config, scope: str) -> nn.Module:
    """The config's model on the CPU in eval mode, built in its library's scope (SyncBN -> BN as the Runner does
    outside distributed training), with zero weights (see ``_ZeroInit``)."""
    import mmvisatt.models  # noqa: F401  (registers the backbones)
    init_default_scope(scope)
    with DefaultScope.overwrite_default_scope(scope), _ZeroInit():
        model = revert_sync_batchnorm(MODELS.build(cfg.model))
    return model.eval()


def count_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


# --------------------------------------------------------------------------------------------- FLOPs


def _cpu_sdpa_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def _counter() -> FlopCounterMode:
    """A FLOP counter that also sees the CPU's fused attention kernel (not in torch's table), so a real CPU forward
    counts what a meta forward (where attention is reduced to ``bmm``) counts."""
    return FlopCounterMode(display=False, custom_mapping={
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_sdpa_flops})


def count_multiply_adds(fn: Callable[[], object]) -> int:
    """Multiply-adds of the matrix products and convolutions ``fn`` runs."""
    counter = _counter()
    with counter, torch.no_grad():
        fn()
    return counter.get_total_flops() // 2


def _fixed_proposals(height: int, width: int, num: int) -> torch.Tensor:
    """``num`` boxes spread over the image at several sizes (deterministic; the heads' cost depends only on the
    number of boxes)."""
    idx = torch.arange(num, dtype=torch.float32)
    side = 32. * 2 ** (idx % 5)  # 32..512 px, so every FPN level gets RoIs
    cx = (idx * 97.) % width
    cy = (idx * 53.) % height
    boxes = torch.stack([cx - side / 2, cy - side / 2, cx + side / 2, cy + side / 2], dim=1)
    boxes[:, 0::2] = boxes[:, 0::2].clamp(0, width - 1)
    boxes[:, 1::2] = boxes[:, 1::2].clamp(0, height - 1)
    return boxes


def _count_split(fn: Callable[[], object], modules: Sequence[nn.Module]) -> Tuple[int, int]:
    """(all, inside ``modules``) multiply-adds of ``fn``; forward hooks read the running total around each call of
    the modules (the model is not edited)."""
    counter = _counter()
    inside, started = [0], []

    def before(module, args):
        started.append(counter.get_total_flops())

    def after(module, args, output):
        inside[0] += counter.get_total_flops() - started.pop()

    handles = [h for m in modules for h in (m.register_forward_pre_hook(before), m.register_forward_hook(after))]
    try:
        with counter, torch.no_grad():
            fn()
    finally:
        for handle in handles:
            handle.remove()
    return counter.get_total_flops() // 2, inside[0] // 2


_ROI_MEMO: Dict[str, int] = {}


def _roi_head_macs(model: nn.Module, roi_cfg, feat_shapes: Sequence[torch.Size], hw: Tuple[int, int]) -> int:
    """Multiply-adds of the RoI heads: box heads on NUM_PROPOSALS proposals, mask heads on MASK_ROIS of them
    (mmdet 2's ``forward_dummy`` convention, which the papers' FLOPs follow; mmdet 3's cascade ``forward`` runs its
    mask heads on every proposal).

    The heads run for real on zero features (RoIAlign has no meta kernel), on a few RoIs: box and mask heads
    process each RoI on its own, so their cost is a per-RoI cost times the number of RoIs. That is checked (the
    count at 2n RoIs must be twice the count at n) before it is scaled up. The same RoI head config on the same
    feature shapes costs the same whatever the backbone, so the result is remembered for the rest of the run."""
    from mmdet.structures import DetDataSample
    from mmengine.structures import InstanceData
    key = hashlib.sha256((str(roi_cfg) + str([tuple(s) for s in feat_shapes])).encode()).hexdigest()
    if key not in _ROI_MEMO:
        feats = tuple(torch.zeros(s) for s in feat_shapes)
        sample = DetDataSample(metainfo=dict(img_shape=hw, ori_shape=hw, pad_shape=hw, batch_input_shape=hw,
                                             scale_factor=(1., 1.)))
        head = model.roi_head
        mask_head = getattr(head, 'mask_head', None)
        masks = list(mask_head) if isinstance(mask_head, nn.ModuleList) else [mask_head] if mask_head else []

        def run(num: int) -> Tuple[int, int]:
            proposals = InstanceData(bboxes=_fixed_proposals(*hw, num))
            total, mask = _count_split(lambda: head.forward(feats, [proposals], [sample]), masks)
            return total - mask, mask

        few = 4
        (box1, mask1), (box2, mask2) = run(few), run(2 * few)
        if (box2, mask2) != (2 * box1, 2 * mask1):
            raise ModelZooError(f'the RoI head {type(head).__name__} does not cost the same per RoI ({box1}, '
                                f'{box2} box and {mask1}, {mask2} mask multiply-adds at {few} and {2 * few} '
                                'RoIs); the zoo cannot scale its count to 1000 proposals')
        _ROI_MEMO[key] = box1 // few * NUM_PROPOSALS + mask1 // few * MASK_ROIS
    return _ROI_MEMO[key]


def count_macs(model: nn.Module, cfg: Config, scope: str, hw: Tuple[int, int]) -> Tuple[int, int]:
    """(whole model, backbone) multiply-adds of one batch-1 inference forward at ``hw``. Moves ``model`` to the
    meta device."""
    x = torch.empty(1, 3, *hw, device='meta')
    if scope == 'mmdet' and getattr(model, 'with_roi_head', False):
        for name, child in model.named_children():
            if name != 'roi_head':
                child.to('meta')
        with torch.no_grad():
            shapes = [f.shape for f in model.extract_feat(x)]
        roi = _roi_head_macs(model, cfg.model.roi_head, shapes, hw)
        model.to('meta')

        def dense():
            feats = model.extract_feat(x)
            if model.with_rpn:
                model.rpn_head.forward(feats)
        total = count_multiply_adds(dense) + roi
    else:
        model.to('meta')
        # tensor mode is backbone -> neck -> head outputs for every library (mmdet single-stage: dense head;
        # mmseg: decode head only, the auxiliary head is training-only; mmpretrain: neck and head)
        total = count_multiply_adds(lambda: model(x, mode='tensor'))
    return total, count_multiply_adds(lambda: model.backbone(x))


# --------------------------------------------------------------------------------------------- measuring


def measure(path: str, flops: bool = True) -> Measurement:
    """Build the config's model and measure it."""
    token, recipe = identify(path)
    scope = recipe_scope(_recipe(recipe))
    cfg = load_config(path)
    if cfg.get('default_scope') != scope:
        raise ModelZooError(f'{path}: default_scope {cfg.get("default_scope")!r}, expected {scope!r} for its '
                            'recipe; regenerate the configs (tools/misc/generate_configs.py)')
    digest = config_hash(cfg)  # before building: the builders edit the config in place
    model = build_model(cfg, scope)
    result = Measurement(config=osp.basename(path)[:-3], token=token, recipe=recipe, scope=scope,
                         config_hash=digest, params=count_params(model),
                         backbone_params=count_params(model.backbone), input_hw=TASK_INPUTS[scope])
    if flops:
        start = time.perf_counter()
        result.macs, result.backbone_macs = count_macs(model, cfg, scope, result.input_hw)
        result.flops_seconds = round(time.perf_counter() - start, 2)
    return result


def complexity(path: str, shape: Optional[Tuple[int, int]] = None, cfg_options: Optional[dict] = None) -> dict:
    """Parameters and multiply-adds of any config's model (whole and backbone), counted as the zoo counts them
    (one batch-1 inference forward; detectors' RoI heads on 1000 proposals and 100 mask RoIs), at ``shape``
    (height, width; default the zoo's input of the config's library). Needs no dataset: the model is built with
    zero weights and run on the meta device."""
    cfg = load_config(path)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    scope = cfg.get('default_scope')
    if scope not in TASK_INPUTS:
        raise ModelZooError(f"{path}: default_scope {scope!r}; the counter knows {sorted(TASK_INPUTS)}")
    hw = tuple(shape) if shape else TASK_INPUTS[scope]
    model = build_model(cfg, scope)
    params, backbone_params = count_params(model), count_params(model.backbone)
    macs, backbone_macs = count_macs(model, cfg, scope, hw)
    return dict(config=path, scope=scope, input_hw=hw, params=params, backbone_params=backbone_params, macs=macs,
                backbone_macs=backbone_macs)


def load_cache(path: str) -> Dict[str, Measurement]:
    if not osp.isfile(path):
        return {}
    with open(path) as f:
        data = json.load(f)
    return {name: Measurement.from_json(entry) for name, entry in data.get('configs', {}).items()}


def save_cache(path: str, cache: Dict[str, Measurement], meta: dict) -> None:
    data = dict(meta, configs={name: asdict(m) for name, m in sorted(cache.items())})
    tmp = path + '.tmp'
    with open(tmp, 'w') as f:
        json.dump(data, f, indent=1)
        f.write('\n')
    os.replace(tmp, path)  # a reader (or an interrupted run) never sees half a file


def measure_configs(paths: Sequence[str], cache_path: Optional[str] = None, flops: bool = True,
                    deadline: Optional[datetime.datetime] = None,
                    log: Callable[[str], None] = lambda s: None) -> List[Measurement]:
    """Measure ``paths`` reusing the cache at ``cache_path`` (entries whose config hash and version still match;
    a cached measurement without FLOPs is completed when ``flops``). After ``deadline`` (UTC) FLOPs are no longer
    measured, parameters still are. The cache is rewritten after every new measurement."""
    cache = load_cache(cache_path) if cache_path else {}
    meta = dict(generator='mmvisatt.analysis.model_zoo', version=MEASURE_VERSION)
    results = []
    for done, path in enumerate(paths, 1):
        name = osp.basename(path)[:-3]
        cached = cache.get(name)
        want_flops = flops and (deadline is None or datetime.datetime.now(datetime.timezone.utc) < deadline)
        if cached is not None and cached.version == MEASURE_VERSION \
                and cached.config_hash == config_hash(load_config(path)) \
                and (cached.macs is not None or not want_flops):
            results.append(cached)
            continue
        result = measure(path, flops=want_flops)
        log(f'[{done}/{len(paths)}] {name}: {result.params / 1e6:.2f}M params'
            + (f', {result.macs / 1e9:.1f} GMACs ({result.flops_seconds}s)' if result.macs is not None else ''))
        cache[name] = result
        results.append(result)
        if cache_path:
            save_cache(cache_path, cache, meta)
    return results


def machine_description() -> str:
    return (f'{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores, {platform.system()} '
            f'{platform.release()}, Python {platform.python_version()}, torch {torch.__version__}')


# --------------------------------------------------------------------------------------------- the document

NOT_MEASURED = 'not measured'
NOT_REPORTED = 'not reported'
# what the recipe's paper rows report, in table order
RECIPE_METRICS = {'mask_rcnn_1x': ('box AP', 'mask AP'), 'mask_rcnn_3x': ('box AP', 'mask AP'),
                  'cascade_mask_rcnn_3x': ('box AP', 'mask AP'), 'retinanet_1x': ('AP', ),
                  'upernet_160k_ade20k': ('mIoU', ), 'fpn_80k_ade20k': ('mIoU', ),
                  'segformer_160k_cityscapes': ('mIoU', ), 'imagenet': ('top-1', )}


def _millions(n: Optional[float]) -> str:
    return f'{n / 1e6:.2f}M' if n is not None else NOT_MEASURED


def _giga(macs: Optional[int]) -> str:
    """Giga multiply-adds, with the precision the papers print (two decimals below 10G)."""
    if macs is None:
        return NOT_MEASURED
    return f'{macs / 1e9:.2f}G' if macs < 1e10 else f'{macs / 1e9:.1f}G'


def _reported_num(value: Optional[float], unit: str) -> str:
    return f'{value:g}{unit}' if value is not None else NOT_REPORTED


def param_difference(measured: int, official: int) -> float:
    """Relative difference of our count from the official one, in percent."""
    return 100. * (measured - official) / official


def _preset_names(config_dir: str) -> Dict[str, str]:
    names = {}
    for token in backbone_tokens(config_dir):
        names[token] = Config.fromfile(osp.join(config_dir, '_base_', 'backbones', f'{token}.py')).preset.name
    return names


def _backbone_section(by_key: Dict[Tuple[str, str], Measurement], tokens: Sequence[str], names: Dict[str, str]):
    from .paper_results import NO_OFFICIAL_COUNT, OFFICIAL_DENSE, official_classifier, reported
    lines = [
        '## Backbones: our ImageNet classifier vs the official one',
        '',
        'Like with like: the whole model of `configs/imagenet_<backbone>.py` (backbone + the official head layout, '
        '1000 classes) against the official classifier built by its own code with 1000 classes (the official '
        'repositories\' own factories). `tests/test_model_zoo.py` fails when the two differ by more than '
        '2%. FLOPs at 224x224. "Dense backbone" is the backbone of the Mask R-CNN 1x config (four outputs, each with '
        'its own output norm, no classifier head).',
        '',
        '| backbone | ours: classifier params | official classifier params | difference | ours: GFLOPs @224 '
        '| official GFLOPs @224 (counted on the official code, see sources) | reported params / GFLOPs / top-1 | '
        'dense backbone params |',
        '|---|---|---|---|---|---|---|---|',
    ]
    why: Dict[str, List[str]] = {}
    cited: Dict[str, int] = {}
    for token in tokens:
        cls = by_key.get((token, 'imagenet'))
        official = official_classifier(token)
        dense = by_key.get((token, 'mask_rcnn_1x'))
        ours = _millions(cls.params) if cls else NOT_MEASURED
        if official is not None and official.params is not None:
            off = f'{official.params / 1e6:.2f}M (`{official.name}`)'
            diff = f'{param_difference(cls.params, official.params):+.3f}%' if cls else NOT_MEASURED
        else:
            off, diff = NOT_REPORTED, '-'
            if token in NO_OFFICIAL_COUNT:
                why.setdefault(NO_OFFICIAL_COUNT[token], []).append(names[token])
        off_gmacs = f'{official.gmacs_224:.2f}G' if official is not None and official.gmacs_224 else NOT_REPORTED
        paper = reported(token, 'imagenet')
        if paper is not None:
            rep = (f'{_reported_num(paper.params_m, "M")} / {_reported_num(paper.gflops, "G")} / '
                   f'{paper.metrics["top-1"]:.1f} {_cite(cited, paper.source)}')
        else:
            rep = NOT_REPORTED
        dense_text = _millions(dense.backbone_params) if dense else NOT_MEASURED
        if token in OFFICIAL_DENSE and dense:
            count, official_name, source = OFFICIAL_DENSE[token]
            dense_text += (f' vs {count / 1e6:.2f}M official `{official_name}` detection backbone '
                           f'({param_difference(dense.backbone_params, count):+.3f}%) {_cite(cited, source)}')
        lines.append(f'| {names[token]} (`{token}`) | {ours} | {off} | {diff} | {_giga(cls.macs if cls else None)} '
                     f'| {off_gmacs} | {rep} | {dense_text} |')
    shown = [official_classifier(t) for t in tokens if official_classifier(t) is not None]
    sources = sorted({o.params_source for o in shown} | {o.gmacs_source for o in shown if o.gmacs_source})
    lines += ['', 'Sources of the official columns:', ''] + [f'- {s}' for s in sources]
    lines += ['', 'Sources of the reported and dense-backbone columns:', ''] + _source_list(cited)
    notes = [f'- {", ".join(who)}: {reason}.' for reason, who in why.items()]
    notes += [f'- {names[t]}: {r.note}.' for (t, k), r in _reported_items() if k == 'imagenet' and r.note
              and t in tokens]
    if notes:
        lines += ['', 'Notes:', ''] + notes
    return lines


def _reported_items():
    from .paper_results import REPORTED
    return REPORTED.items()


def _recipe_section(recipe, by_key, tokens, names):
    from .paper_results import reported
    key = recipe_key(recipe)
    scope = recipe_scope(recipe)
    metrics = RECIPE_METRICS[key]
    lines = [f'## {recipe.title}', '',
             f'Configs `{recipe.name.format(bb="<backbone>")}.py`; FLOPs at {TASK_RESOLUTION[scope]}.', '',
             '| config | params: ours / reported | GFLOPs: ours / reported | backbone: params / GFLOPs | '
             + ' | '.join(f'{m} (reported)' for m in metrics) + ' | source |',
             '|---|---|---|---|' + '---|' * len(metrics) + '---|']
    notes: Dict[str, List[str]] = {}
    sources: Dict[str, int] = {}
    for token in tokens:
        m = by_key.get((token, key))
        if m is None:
            continue
        paper = reported(token, key)
        params_rep = _reported_num(paper.params_m, 'M') if paper else NOT_REPORTED
        flops_rep = _reported_num(paper.gflops, 'G') if paper else NOT_REPORTED
        values = [f'{paper.metrics[x]:.1f}' if paper and x in paper.metrics else NOT_REPORTED for x in metrics]
        source = _cite(sources, paper.source) if paper else '-'
        if paper and paper.note:
            notes.setdefault(paper.note, []).append(f'`{m.config}`')
        lines.append(f'| `{m.config}` | {_millions(m.params)} / {params_rep} | {_giga(m.macs)} / {flops_rep} | '
                     f'{_millions(m.backbone_params)} / {_giga(m.backbone_macs)} | ' + ' | '.join(values)
                     + f' | {source} |')
    if sources:
        lines += ['', 'Sources:', ''] + _source_list(sources)
    if notes:
        lines += ['', 'Notes:', ''] + [f'- {", ".join(configs)}: {note}.' for note, configs in notes.items()]
    return lines


# Swin-T's detectors in the official Swin detection README (SwinTransformer/Swin-Transformer-Object-Detection):
# ReSwin-T is the same network
# plus one residual mix per attention, so its counts check the FLOP convention.
_SWIN_T_GFLOPS = {'mask_rcnn_1x': 267, 'cascade_mask_rcnn_3x': 745}


def _convention_check(by_key) -> str:
    measured = [(key, gflops, by_key[('reswin_t', key)].macs) for key, gflops in _SWIN_T_GFLOPS.items()
                if ('reswin_t', key) in by_key and by_key[('reswin_t', key)].macs is not None]
    if not measured:
        return ''
    pairs = '; '.join(f'`{key}` {macs / 1e9:.1f}G against {gflops}G' for key, gflops, macs in measured)
    return (' As a check of the convention, Swin-T with the same detector heads in the official Swin detection '
            'README (SwinTransformer/Swin-Transformer-Object-Detection) against our ReSwin-T'
            ' (the same network plus one residual mix per '
            f'attention): {pairs}.')


def _cite(sources: Dict[str, int], source: str) -> str:
    """``[n]``, numbering sources in order of first use within a table."""
    sources.setdefault(source, len(sources) + 1)
    return f'[{sources[source]}]'


def _source_list(sources: Dict[str, int]) -> List[str]:
    return [f'- [{n}] {source}' for source, n in sorted(sources.items(), key=lambda item: item[1])]


# family order of the tables (the ReViT family, FAN, RMT / EVT, Shunted) and sizes within a family
_FAMILY_ORDER = ('revit', 'reswin', 'remvit', 'fan_vit', 'fan_hybrid', 'fan_swin', 'rmt', 'evt_swin', 'evt',
                 'shunted')
_SIZE_ORDER = ('t', 's', 'b', 'l')


def table_order(token: str) -> Tuple[int, int, str]:
    family, _, size = token.rpartition('_')
    return (_FAMILY_ORDER.index(family) if family in _FAMILY_ORDER else len(_FAMILY_ORDER),
            _SIZE_ORDER.index(size) if size in _SIZE_ORDER else len(_SIZE_ORDER), token)


def render_markdown(measurements: Sequence[Measurement], command: str, config_dir: str = CONFIG_DIR,
                    generated: Optional[str] = None) -> str:
    """The model zoo document for ``measurements`` (any subset of the configs)."""
    from .paper_results import COMPARISON_NOTES, NOT_REPORTED_WHY
    by_key = {(m.token, m.recipe): m for m in measurements}
    tokens = sorted({m.token for m in measurements}, key=table_order)
    names = _preset_names(config_dir)
    measured = sum(m.macs is not None for m in measurements)
    generated = generated or datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')
    lines = [
        '# Model zoo: measured parameters and FLOPs beside the papers\' numbers',
        '',
        f'Measured by `{command}` on {generated}, on {machine_description()}. The same command measures '
        'again; it keeps the measurement of a config whose resolved config is unchanged (`docs/model_zoo.json`), '
        'so after a change of model code delete that file to measure every config.',
        '',
        f'{len(measurements)} configs; FLOPs measured for {measured}'
        + (f', "{NOT_MEASURED}" for the other {len(measurements) - measured}' if measured < len(measurements)
           else '') + '. Parameters are measured for all.',
        '',
        '**What is counted.** Parameters: every parameter of the model built from the config (`sum(numel)`, '
        'trainable or not; no pretrained weights are needed for counting). FLOPs: '
        '`torch.utils.flop_counter.FlopCounterMode` over one inference forward (`mode=\'tensor\'`, batch 1) at '
        'the task resolution: detection 1280x800 (input 800x1280), segmentation 2048x512 (input 512x2048), '
        'classification 224x224. The counter sees matrix products (`mm`, `addmm`, `bmm`, `baddbmm`, with attention '
        'and `einsum` reduced to them) and convolutions; element-wise ops, norms, softmax, pooling, interpolation '
        'and RoIAlign are not counted. **GFLOPs here are giga multiply-adds** (the counter\'s FLOPs / 2), the unit '
        'the papers call FLOPs. Detectors: backbone + neck + dense heads up to their raw outputs (no NMS); '
        f'two-stage RoI heads on {NUM_PROPOSALS} proposals, box heads on all, mask heads on the first '
        f'{MASK_ROIS} (the convention of mmdet 2\'s `forward_dummy` that the papers\' FLOPs follow; counted on a few '
        'RoIs and multiplied, the heads process each RoI on its own). The forward runs on the `meta` device, where '
        'attention is reduced to matrix products; the CPU\'s fused attention kernel is counted as the same '
        'products, so a real forward gives the same number. Segmentors: backbone + neck + decode head (the auxiliary '
        'head is training-only). Classifiers: backbone + neck + head.' + _convention_check(by_key),
        '',
        '"not reported": the papers / official repositories give no such number, or it could not be confirmed '
        'against their text (`mmvisatt/analysis/paper_results.py` holds every reported number with its source; '
        'nothing is estimated).',
        '',
    ]
    lines += _backbone_section(by_key, tokens, names) + ['']
    for recipe in RECIPES:
        if any(m.recipe == recipe_key(recipe) for m in measurements) and recipe_key(recipe) != 'imagenet':
            lines += _recipe_section(recipe, by_key, tokens, names) + ['']
    if any(m.recipe == 'imagenet' for m in measurements):
        lines += _recipe_section(next(r for r in RECIPES if recipe_key(r) == 'imagenet'), by_key, tokens, names)
        lines.append('')
    lines += ['## Reading the comparison', ''] + [f'- {k}: {v}.' for k, v in COMPARISON_NOTES.items()] + ['']
    lines += ['## Why numbers are missing', ''] + [f'- {k}: {v}.' for k, v in NOT_REPORTED_WHY.items()] + ['']
    return '\n'.join(lines)


def main(argv: Optional[Sequence[str]] = None) -> None:
    import argparse
    import sys
    parser = argparse.ArgumentParser(description='Measure parameters and FLOPs of the task configs and write the '
                                     'model zoo (docs/model_zoo.md) beside the papers\' numbers.')
    parser.add_argument('--configs', nargs='+', default=['*.py'], metavar='GLOB',
                        help='file-name globs of the configs in configs/ to include (default: all)')
    parser.add_argument('--out', default=osp.join(REPO_ROOT, 'docs', 'model_zoo.md'),
                        help='the Markdown file; the measurement cache is written next to it as <out>.json')
    parser.add_argument('--json', action='store_true', help='print the measurements as JSON on stdout too')
    parser.add_argument('--no-flops', action='store_true', help='count parameters only (fast)')
    parser.add_argument('--stop-flops-at', metavar='HH:MM', default=None,
                        help='UTC time after which FLOPs are no longer measured (parameters still are)')
    parser.add_argument('--config-dir', default=CONFIG_DIR, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    deadline = None
    if args.stop_flops_at:
        try:
            hour, minute = (int(v) for v in args.stop_flops_at.split(':'))
            now = datetime.datetime.now(datetime.timezone.utc)
            deadline = now.replace(hour=hour, minute=minute, second=0, microsecond=0)
        except ValueError:
            parser.error(f'--stop-flops-at {args.stop_flops_at!r}: expected a UTC time as HH:MM, e.g. 08:50')
    if not args.out.endswith('.md'):
        parser.error(f'--out {args.out!r}: expected a Markdown file name ending in .md')
    cache_path = args.out[:-3] + '.json'
    try:
        paths = discover_configs(args.config_dir, args.configs)
        os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
        results = measure_configs(paths, cache_path, flops=not args.no_flops, deadline=deadline,
                                  log=lambda s: print(s, file=sys.stderr, flush=True))
    except ModelZooError as error:
        parser.error(str(error))
    arguments = sys.argv[1:] if argv is None else list(argv)
    command = ' '.join(['python tools/analysis/model_zoo.py'] + arguments)
    with open(args.out, 'w') as f:
        f.write(render_markdown(results, command, args.config_dir))
    if args.json:
        print(json.dumps([asdict(m) for m in results], indent=1))
    print(f'wrote {args.out} ({len(results)} configs) and {cache_path}', file=sys.stderr)
