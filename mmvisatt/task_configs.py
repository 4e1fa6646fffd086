"""The task configs: every backbone preset (``configs/_base_/backbones/<token>.py``) x every downstream recipe.

A task config is a few lines over ``configs/_base_``: the detector / segmenter / classifier, dataset, schedule and
runtime bases, plus the backbone base whose ``preset`` dict holds what belongs to the backbone (its settings, output
channels, ImageNet recipe). The dense recipes' values (optimizer, parameter-wise rules, drop path, warmup, batch,
AMP, the backbone settings of the recipe) come from the recipe table :mod:`mmvisatt.recipes` and are written into
each config as literals, with a header naming their source. The files are written from here
(``tools/misc/generate_configs.py``) and a test keeps the checked-in files equal to them. Edit a recipe in
``mmvisatt/recipes.py`` or a preset in its base, never a task config.
"""
import functools
import json
import os
import os.path as osp
import textwrap
from dataclasses import dataclass
from typing import Any, Dict, List, Tuple

from mmengine.config import Config

from .recipes import GPUS, PAPER_VS_CODE, SCHEDULES, TrainRecipe, recipe_for


@dataclass(frozen=True)
class Recipe:
    """One downstream recipe: the config name pattern, its title, its ``_base_`` files and, for ImageNet, the body
    (dense bodies are written from their :class:`~mmvisatt.recipes.TrainRecipe`, :func:`dense_body`)."""
    name: str  # with {bb} for the backbone token
    title: str
    task: str  # det, seg or fpn (dense, values from mmvisatt.recipes) or cls (the preset's ``cls`` entry)
    bases: Tuple[str, ...]
    body: str = ''
    only: Tuple[str, ...] = ()  # backbone token prefixes the recipe exists for (empty: every backbone)

    def applies_to(self, token: str) -> bool:
        return not self.only or token.startswith(self.only)


_MS_CROP = 'datasets/coco_instance_ms_crop.py'
RECIPES: Tuple[Recipe, ...] = (
    Recipe('mask_rcnn_{bb}_1x', 'Mask R-CNN + FPN, 1x schedule (12 epochs), single-scale COCO instance training',
           'det', ('models/mask_rcnn_fpn.py', 'datasets/coco_instance.py', 'schedules/schedule_1x.py',
                   'default_runtime_det.py')),
    Recipe('mask_rcnn_{bb}_3x', 'Mask R-CNN + FPN, 3x schedule (36 epochs) with multi-scale training and crops',
           'det', ('models/mask_rcnn_fpn.py', _MS_CROP, 'schedules/schedule_3x.py', 'default_runtime_det.py')),
    Recipe('cascade_mask_rcnn_{bb}_3x', 'Cascade Mask R-CNN (4conv1fc box heads, GIoU) + FPN, 3x schedule with '
           'multi-scale training and crops', 'det',
           ('models/cascade_mask_rcnn_fpn_4conv1fc_giou.py', _MS_CROP, 'schedules/schedule_3x.py',
            'default_runtime_det.py')),
    Recipe('retinanet_{bb}_1x', 'RetinaNet + FPN, 1x schedule, COCO detection', 'det',
           ('models/retinanet_fpn.py', 'datasets/coco_detection.py', 'schedules/schedule_1x.py',
            'default_runtime_det.py')),
    Recipe('upernet_{bb}_160k_ade20k', 'UperNet (+ FCN auxiliary head), 160k iterations, ADE20K 512x512', 'seg',
           ('models/upernet.py', 'datasets/ade20k.py', 'schedules/schedule_160k.py', 'default_runtime_seg.py')),
    Recipe('fpn_{bb}_80k_ade20k', 'Semantic FPN, 80k iterations, ADE20K 512x512', 'fpn',
           ('models/semantic_fpn.py', 'datasets/ade20k.py', 'schedules/schedule_80k.py', 'default_runtime_seg.py')),
    Recipe('segformer_{bb}_160k_cityscapes', 'SegFormer head, 160k iterations, Cityscapes 1024x1024 crops, the '
           'official FAN segmentation recipe', 'seg',
           ('models/segformer.py', 'datasets/cityscapes_1024x1024.py', 'schedules/schedule_160k.py',
            'default_runtime_seg.py'), only=('fan_hybrid_', )),
    Recipe('imagenet_{bb}', 'ImageNet-1k classifier with the official head layout; evaluates a converted official '
           'checkpoint (tools/model_converters/convert.py, then tools/test.py) or trains 300 epochs', 'cls',
           ('models/image_classifier.py', 'datasets/imagenet.py', 'schedules/imagenet_300e.py',
            'default_runtime_cls.py'),
           '''model = dict(
    backbone=dict(_base_.preset.backbone, drop_path_rate=_base_.preset.{dp_entry}drop_path_rate,
                  out_indices=(_base_.preset.{entry}.out_index, ),
                  **_base_.preset.{entry}.get('backbone', {{}})),
    neck=_base_.preset.{entry}.get('neck', dict(type='GlobalAveragePooling')),
    head=dict(in_channels=_base_.preset.{entry}.channels))
optim_wrapper = dict(
    optimizer=_base_.preset.{entry}.optimizer,
    clip_grad=_base_.preset.{entry}.clip_grad,
    # biases, norms and every 1-D parameter (alpha included) without weight decay, as the official runs
    paramwise_cfg=dict(norm_decay_mult=0., bias_decay_mult=0., flat_decay_mult=0.,
                       custom_keys={{key: dict(decay_mult=0.) for key in _base_.preset.no_decay}}))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, end=_base_.preset.{entry}.warmup_epochs,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=True, begin=_base_.preset.{entry}.warmup_epochs)
]
auto_scale_lr = dict(base_batch_size=_base_.preset.{entry}.batch_size)
val_dataloader = dict(dataset=dict(pipeline=[
    dict(type='LoadCheckedImageFromFile'),
    dict(type='ResizeEdge', scale=_base_.preset.{entry}.test_resize, edge='short', backend='pillow',
         interpolation='bicubic'),
    dict(type='CenterCrop', crop_size=224),
    dict(type='PackInputs'),
]))
test_dataloader = val_dataloader
'''),
)

_SCOPES = {'det': 'mmdet', 'seg': 'mmseg', 'fpn': 'mmseg', 'cls': 'mmpretrain'}


def recipe_scope(recipe: Recipe) -> str:
    """The OpenMMLab library (default_scope) that runs configs of ``recipe``."""
    return _SCOPES[recipe.task]


def recipe_key(recipe: Recipe) -> str:
    """The recipe's name without the backbone, e.g. 'mask_rcnn_3x', 'imagenet'."""
    return recipe.name.replace('{bb}_', '').replace('_{bb}', '')


def backbone_tokens(config_dir: str) -> List[str]:
    """Every backbone preset with a base in ``config_dir/_base_/backbones``."""
    folder = osp.join(config_dir, '_base_', 'backbones')
    # files starting with '_' hold what a family's presets share
    return sorted(f[:-3] for f in os.listdir(folder) if f.endswith('.py') and not f.startswith('_'))


def literal(value: Any, indent: int = 0, column: int = 0) -> str:
    """``value`` as config text starting at ``column`` of a line indented by ``indent``: dicts as ``dict(...)``
    (``{...}`` where a key is no identifier), one entry a line where the one-line form would pass column 118."""
    inner = indent + 4
    if isinstance(value, dict):
        named = all(isinstance(k, str) and k.isidentifier() for k in value)
        items = [f'{k}={literal(v, inner, inner + len(k) + 1)}' if named else
                 f'{k!r}: {literal(v, inner, inner + len(repr(k)) + 2)}' for k, v in value.items()]
        opening, closing = ('dict(', ')') if named else ('{', '}')
    elif isinstance(value, (list, tuple)):
        items = [literal(v, inner, inner) for v in value]
        opening, closing = ('(', ')') if isinstance(value, tuple) else ('[', ']')
        if isinstance(value, tuple) and len(items) == 1:
            items[0] += ','
    else:
        return repr(value)
    one = opening + ', '.join(items) + closing
    if column + len(one) <= 118 and '\n' not in one:
        return one
    pad = ' ' * inner
    # dict( closes on its last entry's line (mmdet style); brackets on a line of their own
    tail = closing if opening == 'dict(' else '\n' + ' ' * indent + closing
    return opening + ','.join(f'\n{pad}{item}' for item in items) + tail


def optim_wrapper(recipe: TrainRecipe) -> Dict[str, Any]:
    """The ``optim_wrapper`` of a dense recipe."""
    wrapper: Dict[str, Any] = dict(type='AmpOptimWrapper' if recipe.amp else 'OptimWrapper')
    if recipe.amp not in (None, 'dynamic'):  # AmpOptimWrapper's default is 'dynamic'
        wrapper['loss_scale'] = recipe.amp
    wrapper['optimizer'] = dict(recipe.optimizer)
    paramwise: Dict[str, Any] = {}
    if recipe.norm_decay_mult is not None:
        paramwise['norm_decay_mult'] = recipe.norm_decay_mult
    keys = {key: dict(decay_mult=0.) for key in recipe.no_decay}
    for key, mult in recipe.lr_mult.items():
        keys.setdefault(key, {})['lr_mult'] = mult
    if keys:
        paramwise['custom_keys'] = keys
    if paramwise:
        wrapper['paramwise_cfg'] = paramwise
    return wrapper


def param_scheduler(key: str, recipe: TrainRecipe) -> List[Dict[str, Any]]:
    """The ``param_scheduler`` of a dense recipe: the warmup, then the recipe kind's decay."""
    schedule = SCHEDULES[key]
    warmup = [dict(type='LinearLR', start_factor=recipe.warmup_ratio, by_epoch=False, begin=0,
                   end=recipe.warmup_iters)] if recipe.warmup_iters else []
    if schedule.max_epochs:
        return warmup + [dict(type='MultiStepLR', begin=0, end=schedule.max_epochs, by_epoch=True,
                              milestones=list(schedule.milestones), gamma=0.1)]
    return warmup + [dict(type='PolyLR', eta_min=recipe.min_lr, power=schedule.power, begin=recipe.warmup_iters,
                          end=schedule.max_iters, by_epoch=False)]


@functools.lru_cache(maxsize=None)
def _base_values(config_dir: str, dataset: str, schedule: str) -> Config:
    """What a dataset and a schedule base set (the values a task config need not repeat); read once per pair, as
    every backbone's config of a recipe shares them. Read only."""
    return Config(dict(Config.fromfile(osp.join(config_dir, '_base_', dataset)).to_dict(),
                       **Config.fromfile(osp.join(config_dir, '_base_', schedule)).to_dict()))


def dense_body(config_dir: str, recipe: Recipe, values: TrainRecipe) -> str:
    """The body of a dense task config: the backbone settings, optimizer, schedule and batch of ``values``."""
    key = recipe_key(recipe)
    backbone = [f'_base_.preset.backbone, drop_path_rate={values.drop_path_rate!r}']
    backbone += [f'{k}={literal(v, 18, 18 + len(k) + 1)}' for k, v in values.backbone.items()]
    if values.checkpoint_key:
        backbone.append(f'init_cfg=dict(_base_.preset.backbone.init_cfg, checkpoint_key={values.checkpoint_key!r})')
    if key == 'retinanet_1x':
        # The FPN reads strides 8-32 only; the stride-4 output is not built (its unused norm would stop DDP).
        backbone.append('out_indices=(1, 2, 3)')
        consumers = ['neck=dict(in_channels=_base_.preset.channels[1:], start_level=0)']
    elif key.startswith('upernet'):
        consumers = ['decode_head=dict(in_channels=_base_.preset.channels)',
                     'auxiliary_head=dict(in_channels=_base_.preset.channels[2])']
    elif key.startswith('segformer'):
        # the fourth level is the stride-16 token map (feat_downsample=False): the stride-16 width again
        consumers = ['decode_head=dict(in_channels=_base_.preset.channels[:3] + _base_.preset.channels[2:3])']
    else:
        consumers = ['neck=dict(in_channels=_base_.preset.channels)']
    text = 'model = dict(\n    backbone=dict(' + ',\n                  '.join(backbone) + '),\n    '
    text += ',\n    '.join(consumers) + ')\n'
    text += f'optim_wrapper = {literal(optim_wrapper(values), 0, len("optim_wrapper = "))}\n'
    base = _base_values(config_dir, recipe.bases[1], recipe.bases[2])
    schedulers = param_scheduler(key, values)
    if [dict(s) for s in base.param_scheduler] != schedulers:
        text += f'param_scheduler = {literal(schedulers, 0, len("param_scheduler = "))}\n'
    if base.train_dataloader.batch_size != values.images_per_gpu:
        text += f'train_dataloader = dict(batch_size={values.images_per_gpu})\n'
    text += f'auto_scale_lr = dict(enable=False, base_batch_size={values.total_batch})\n'
    return text


@functools.lru_cache(maxsize=4)
def _memory_rows(config_dir: str) -> Dict[str, Dict[str, Any]]:
    """The memory table's rows (``docs/config_memory.json`` beside ``config_dir``) by config file name."""
    path = osp.join(osp.dirname(osp.abspath(config_dir)), 'docs', 'config_memory.json')
    if not osp.isfile(path):
        return {}
    with open(path) as f:
        return json.load(f)['rows']


def _measured_memory(config_dir: str, name: str) -> str:
    """The figures behind a config's memory settings, from its row of the memory table: the step as configured, at
    the recipe's own layout where the config spreads over more GPUs, and without the settings."""
    row = _memory_rows(config_dir).get(name)
    if row is None:
        return ''
    precision = f"AMP ({row['dtype']})" if row.get('amp') else 'float32'
    figures = [f"{row['per_gpu'] / 1e9:.1f} GB at {row['batch_per_gpu']} images per GPU in {precision}"]
    if row.get('at_recipe_layout'):
        figures.append(f"{row['at_recipe_layout']['per_gpu'] / 1e9:.1f} GB at "
                       f"{row['at_recipe_layout']['batch_per_gpu']}")
    if row.get('without'):
        figures.append(f"{row['without']['per_gpu'] / 1e9:.1f} GB without {row['without']['settings']}")
    return '; '.join(figures)


def render(config_dir: str, token: str, recipe: Recipe) -> str:
    """The text of the task config of backbone ``token`` and ``recipe``."""
    preset = Config.fromfile(osp.join(config_dir, '_base_', 'backbones', f'{token}.py')).preset
    key = recipe_key(recipe)
    comment = [f'{recipe.title}, with {preset.name}.']
    if recipe.task == 'cls':
        comment.append(f'Recipe: {preset.cls.recipe}; backbone settings in _base_/backbones/{token}.py.')
        # a task's own drop path, else the preset's
        dp_entry = 'cls.' if 'drop_path_rate' in preset.get('cls', {}) else ''
        body = recipe.body.format(entry='cls', dp_entry=dp_entry)
    else:
        values = recipe_for(token, key)
        comment.append(f'Recipe: {values.describe()}.')
        if values.why:
            comment.append(f'Why: {values.why}.')
        if values.reported:
            comment.append(f'Reported: {values.reported}.')
        if values.memory:
            comment.append(f'Memory: {values.memory}.')
            measured = _measured_memory(config_dir, recipe.name.format(bb=token) + '.py')
            if measured:
                comment.append(f'Measured per GPU (docs/benchmarks.md): {measured}.')
        comment.append(f'Every value with its source line, and each deviation with its reason: docs/recipes.md. '
                       f'Backbone settings in _base_/backbones/{token}.py.')
        body = dense_body(config_dir, recipe, values)
    comment.append('Written by tools/misc/generate_configs.py from mmvisatt/recipes.py and mmvisatt/task_configs.py: '
                   'edit those, not this.')
    lines = [line for text in comment
             for line in textwrap.wrap(text, 118, initial_indent='# ', subsequent_indent='# ')]
    bases = [f'_base_/{b}' for b in recipe.bases] + [f'_base_/backbones/{token}.py']
    lines.append('_base_ = [\n' + ''.join(f"    '{b}',\n" for b in bases) + ']')
    return '\n'.join(lines) + '\n\n' + body


def expected_configs(config_dir: str) -> Dict[str, str]:
    """File name -> text of every task config."""
    return {recipe.name.format(bb=token) + '.py': render(config_dir, token, recipe)
            for token in backbone_tokens(config_dir) for recipe in RECIPES if recipe.applies_to(token)}


def write_configs(config_dir: str) -> List[str]:
    """Write every task config that is missing or differs; returns the names written."""
    written = []
    for name, text in expected_configs(config_dir).items():
        path = osp.join(config_dir, name)
        if not osp.isfile(path) or open(path).read() != text:
            with open(path, 'w') as f:
                f.write(text)
            written.append(name)
    return written


def _cell(recipe: TrainRecipe) -> List[str]:
    opt = recipe.optimizer
    paramwise = ', '.join(recipe.no_decay) or 'none (all decayed)'
    if recipe.norm_decay_mult is not None:
        paramwise += f'; norm_decay_mult {recipe.norm_decay_mult:g}'
    amp = 'fp32' if recipe.amp is None else 'fp16 dynamic' if recipe.amp == 'dynamic' else f'fp16 x{recipe.amp:g}'
    backbone = ', '.join(f'{k}={v["type"] if isinstance(v, dict) else v}' for k, v in recipe.backbone.items())
    if recipe.checkpoint_key:
        backbone += f'{", " if backbone else ""}checkpoint entry {recipe.checkpoint_key!r}'
    warmup = f'{recipe.warmup_iters} it x{recipe.warmup_ratio:g}' if recipe.warmup_iters else 'none'
    if recipe.min_lr:
        warmup += f'; min lr {recipe.min_lr:g}'
    return [f'{opt["type"]} {opt["lr"]:g}', f'{opt["weight_decay"]:g}', paramwise, f'{recipe.drop_path_rate:g}',
            warmup, f'{recipe.gpus} x {recipe.images_per_gpu} = {recipe.total_batch}', amp, backbone or '-']


def recipes_page(config_dir: str) -> str:
    """``docs/recipes.md``: every dense config's recipe, the official values' sources and every deviation."""
    lines = [
        '# Downstream recipes', '',
        'Written by `tools/misc/generate_configs.py` from the recipe table `mmvisatt/recipes.py`, the single source '
        'of the dense task configs; `tests/test_recipes.py` loads every config and checks its effective values '
        '(after `_base_` merging) against the table, and the table\'s official entries against the official '
        'files. Edit the table, never this page.', '',
        f'- **Layout.** Every recipe is written for {GPUS} GPUs (a few multi-scale 3x recipes for 16 or 32, where '
        'the step is over 80 GB per GPU otherwise; their headers say so): `train_dataloader.batch_size` = total '
        'batch / GPUs, and `auto_scale_lr.base_batch_size` = the total batch, so `tools/train.py --auto-scale-lr` '
        'rescales the lr linearly for any other number of GPUs or images per GPU.',
        '- **Official or borrowed.** *Official*: the pair has an official downstream config, and the values are '
        'that file\'s (repository@commit:path, lines below). *Borrowed*: no official counterpart exists; the row '
        'names the official recipe it takes, and why. No header claims a reported number for a borrowed recipe.',
        '- **AMP.** The configs whose official run used fp16 use `AmpOptimWrapper` with the official loss scale '
        '(apex O1 runs become torch AMP with a dynamic scale). `tools/train.py` trains them in float32 on a '
        'machine without CUDA, with one log line; `--cfg-options optim_wrapper.type=OptimWrapper` turns AMP off '
        'anywhere (our `tools/train.py` then drops the AMP-only `loss_scale`; the stock mmdet / mmseg `train.py` keep '
        'it, so there the two static-scale recipes, RMT RetinaNet and UperNet, need a config that inherits ours '
        'with `optim_wrapper = dict(_delete_=True, type=\'OptimWrapper\', ...)`). On a machine without CUDA the '
        'stock `train.py` stops at mmengine\'s assertion that AmpOptimWrapper needs a GPU; use ours there.',
        '- **SyncBN.** `norm_cfg=SyncBN` in the backbone where the official dense code synchronises its '
        'BatchNorms (RMT / EVT stem and downsampling, FAN); single-process runs revert it to BatchNorm '
        '(mmengine), CPU multi-process runs use `CPUSyncBN`.',
        '- **Schedules** come from `configs/_base_/schedules` (12 or 36 epochs with steps at 8/11 or 27/33; 160k '
        'or 80k iterations with poly decay); the warmup column is the linear warmup in iterations and its start '
        'factor.', '',
        'ImageNet configs are not in the table: their recipes are the presets\' `cls` entries.', '']
    tokens = backbone_tokens(config_dir)
    families = [('RMT', 'rmt_'), ('EVT', 'evt_'), ('FAN', 'fan_'), ('ReViT family', 're'), ('Shunted', 'shunted_')]
    for family, prefix in families:
        lines += [f'## {family}', '',
                  '| config | recipe | optimizer | wd | no weight decay | drop path | warmup | batch | AMP | '
                  'backbone |', '|' + ' --- |' * 10]
        sources: Dict[Tuple[str, str], TrainRecipe] = {}
        for token in tokens:
            if not token.startswith(prefix):
                continue
            for recipe in RECIPES:
                if recipe.task == 'cls' or not recipe.applies_to(token):
                    continue
                values = recipe_for(token, recipe_key(recipe))
                kind = 'official' if values.official else 'borrowed'
                lines.append(f'| `{recipe.name.format(bb=token)}` | {kind}: {values.label} | '
                             + ' | '.join(_cell(values)) + ' |')
                sources.setdefault((values.label, values.why), values)
        lines += ['', f'Sources ({family}):', '']
        for (label, _), values in sorted(sources.items()):
            lines.append(f"- **{label}**{'' if values.official else ' (borrowed)'}: `{values.source}`")
            lines += [f'  - {field_}: {where}' for field_, where in values.lines.items()]
            if values.why:
                lines.append(f'  - why this recipe: {values.why}')
            lines += [f'  - deviation: {d}' for d in values.deviations]
            if values.memory:
                lines.append(f'  - memory: {values.memory}')
            if values.reported:
                lines.append(f'  - reported: {values.reported}')
        lines.append('')
    lines += ['## Paper against released code', '',
              'Where a paper and the code its authors released disagree, the configs follow the code whose weights '
              'were released (those weights are where users start), and this table says so. The papers\' texts '
              'are cited by arXiv number and section (RMT: arXiv 2309.11523 v5); '
              '`tests/test_seed_facts.py` pins the paper values.', '',
              '| model | setting | the paper | the released code | our configs | why |', '|' + ' --- |' * 6]
    lines += [f'| {r.model} | {r.setting} | {r.paper} | {r.code} | {r.config} | {r.why} |' for r in PAPER_VS_CODE]
    lines.append('')
    return '\n'.join(lines)
