"""The task configs: every backbone preset (``configs/_base_/backbones/<token>.py``) x every downstream recipe.

A task config is a few lines over ``configs/_base_``: the detector / segmenter / classifier, dataset, schedule and
runtime bases, plus the backbone base whose ``preset`` dict holds what differs per backbone (its output channels,
drop path and optimizer per task, the parameters without weight decay). The glue between them is the same for
every backbone, so the files are written from the templates below (``tools/misc/generate_configs.py``) and a
test keeps the checked-in files equal to them. Edit a recipe here or a preset in its base, never a task config.
"""
import os
import os.path as osp
import textwrap
from dataclasses import dataclass
from typing import Dict, List, Tuple

from mmengine.config import Config

# The optimizer glue shared by the templates: the preset's optimizer for the task and no weight decay on the
# preset's `no_decay` names.
_DENSE_OPTIM = '''optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=_base_.preset.{entry}.optimizer,
    paramwise_cfg=dict(custom_keys={{key: dict(decay_mult=0.) for key in _base_.preset.no_decay}}))'''


@dataclass(frozen=True)
class Recipe:
    """One downstream recipe: the config name pattern, its title, its ``_base_`` files and the body."""
    name: str  # with {bb} for the backbone token
    title: str
    task: str  # the preset entry holding its drop path and optimizer (det, seg, fpn or cls), unless the preset
    # has an entry named after the recipe (e.g. 'retinanet_1x') for a pair whose recipe differs
    bases: Tuple[str, ...]
    body: str


RECIPES: Tuple[Recipe, ...] = (
    Recipe('mask_rcnn_{bb}_1x', 'Mask R-CNN + FPN, 1x schedule (12 epochs), single-scale COCO instance training',
           'det', ('models/mask_rcnn_fpn.py', 'datasets/coco_instance.py', 'schedules/schedule_1x.py',
                   'default_runtime_det.py'),
           '''model = dict(
    backbone=dict(_base_.preset.backbone, drop_path_rate=_base_.preset.{dp_entry}drop_path_rate),
    neck=dict(in_channels=_base_.preset.channels))
''' + _DENSE_OPTIM + '''
auto_scale_lr = dict(base_batch_size=_base_.preset.{entry}.batch_size)
'''),
    Recipe('mask_rcnn_{bb}_3x', 'Mask R-CNN + FPN, 3x schedule (36 epochs) with multi-scale training and crops',
           'det', ('models/mask_rcnn_fpn.py', 'datasets/coco_instance_ms_crop.py', 'schedules/schedule_3x.py',
                   'default_runtime_det.py'),
           '''model = dict(
    backbone=dict(_base_.preset.backbone, drop_path_rate=_base_.preset.{dp_entry}drop_path_rate),
    neck=dict(in_channels=_base_.preset.channels))
''' + _DENSE_OPTIM + '''
auto_scale_lr = dict(base_batch_size=_base_.preset.{entry}.batch_size)
'''),
    Recipe('cascade_mask_rcnn_{bb}_3x', 'Cascade Mask R-CNN (4conv1fc box heads, GIoU) + FPN, 3x schedule with '
           'multi-scale training and crops', 'det',
           ('models/cascade_mask_rcnn_fpn_4conv1fc_giou.py', 'datasets/coco_instance_ms_crop.py',
            'schedules/schedule_3x.py', 'default_runtime_det.py'),
           '''model = dict(
    backbone=dict(_base_.preset.backbone, drop_path_rate=_base_.preset.{dp_entry}drop_path_rate),
    neck=dict(in_channels=_base_.preset.channels))
''' + _DENSE_OPTIM + '''
auto_scale_lr = dict(base_batch_size=_base_.preset.{entry}.batch_size)
'''),
    Recipe('retinanet_{bb}_1x', 'RetinaNet + FPN, 1x schedule, COCO detection', 'det',
           ('models/retinanet_fpn.py', 'datasets/coco_detection.py', 'schedules/schedule_1x.py',
            'default_runtime_det.py'),
           '''# The FPN reads strides 8-32 only; the stride-4 output is not built (its unused norm would stop DDP).
model = dict(
    backbone=dict(_base_.preset.backbone, drop_path_rate=_base_.preset.{dp_entry}drop_path_rate,
                  out_indices=(1, 2, 3)),
    neck=dict(in_channels=_base_.preset.channels[1:], start_level=0))
''' + _DENSE_OPTIM + '''
auto_scale_lr = dict(base_batch_size=_base_.preset.{entry}.batch_size)
'''),
    Recipe('upernet_{bb}_160k_ade20k', 'UperNet (+ FCN auxiliary head), 160k iterations, ADE20K 512x512', 'seg',
           ('models/upernet.py', 'datasets/ade20k.py', 'schedules/schedule_160k.py', 'default_runtime_seg.py'),
           '''model = dict(
    backbone=dict(_base_.preset.backbone, drop_path_rate=_base_.preset.{dp_entry}drop_path_rate),
    decode_head=dict(in_channels=_base_.preset.channels),
    auxiliary_head=dict(in_channels=_base_.preset.channels[2]))
''' + _DENSE_OPTIM + '\n'),
    Recipe('fpn_{bb}_80k_ade20k', 'Semantic FPN, 80k iterations, ADE20K 512x512', 'fpn',
           ('models/semantic_fpn.py', 'datasets/ade20k.py', 'schedules/schedule_80k.py', 'default_runtime_seg.py'),
           '''model = dict(
    backbone=dict(_base_.preset.backbone, drop_path_rate=_base_.preset.{dp_entry}drop_path_rate),
    neck=dict(in_channels=_base_.preset.channels))
''' + _DENSE_OPTIM + '\n'),
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
    dict(type='LoadImageFromFile'),
    dict(type='CheckImageIntegrity'),
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


def render(config_dir: str, token: str, recipe: Recipe) -> str:
    """The text of the task config of backbone ``token`` and ``recipe``."""
    preset = Config.fromfile(osp.join(config_dir, '_base_', 'backbones', f'{token}.py')).preset
    key = recipe_key(recipe)
    entry = key if key in preset else recipe.task
    # a task's own drop path, else the preset's
    dp_entry = f'{entry}.' if 'drop_path_rate' in preset[entry] else ''
    comment = [f'{recipe.title}, with {preset.name}.',
               f'Recipe: {preset[entry].recipe}; backbone settings in _base_/backbones/{token}.py.']
    if key in preset.reported:
        comment.append(f'Reported: {preset.reported[key]}.')
    comment.append('Written by tools/misc/generate_configs.py from mmvisatt/task_configs.py: edit those, not this.')
    lines = [line for text in comment
             for line in textwrap.wrap(text, 118, initial_indent='# ', subsequent_indent='# ')]
    bases = [f'_base_/{b}' for b in recipe.bases] + [f'_base_/backbones/{token}.py']
    lines.append('_base_ = [\n' + ''.join(f"    '{b}',\n" for b in bases) + ']')
    return '\n'.join(lines) + '\n\n' + recipe.body.format(entry=entry, dp_entry=dp_entry)


def expected_configs(config_dir: str) -> Dict[str, str]:
    """File name -> text of every task config."""
    return {recipe.name.format(bb=token) + '.py': render(config_dir, token, recipe)
            for token in backbone_tokens(config_dir) for recipe in RECIPES}


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
