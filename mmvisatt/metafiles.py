"""The OpenMMLab model index: ``model-index.yml`` and one metafile per family (``configs/metafiles/<family>.yml``).

``mim search mmvisatt`` and ``mim train mmvisatt CONFIG`` read them from an installed package's ``mmvisatt/.mim``
(``setup.py`` puts the configs, the tools and the index there). Every task config is one model entry: its
collection (the family), config file, training data, schedule and resources, parameters and FLOPs as the model zoo
measured them (``docs/model_zoo.json``, multiply-adds at the zoo's input size), the results the paper or the
official repository reports for that recipe (``mmvisatt.analysis.paper_results``, with their source; none where
nothing is reported), and the official ImageNet weights: the release URL as ``Weights`` of the ImageNet
classifier, and where a dense config's backbone comes from. Written by ``tools/misc/generate_configs.py``; a test
keeps the checked-in files equal to what this module writes.
"""
import json
import os.path as osp
import re
from typing import Dict, List, Optional

import yaml
from mmengine.config import Config

from .recipes import GPUS, SCHEDULES, recipe_for
from .task_configs import RECIPES, Recipe, backbone_tokens, expected_configs, recipe_key

METAFILE_DIR = 'metafiles'
# family -> collection: name, token prefixes, paper, official code, our notes, what its attention is
FAMILIES: Dict[str, dict] = {
    'revit': dict(name='ReViT', prefixes=('revit_', 'reswin_', 'remvit_'),
                  paper='ReViT: Enhancing Vision Transformers Feature Diversity with Attention Residual Connections',
                  url='https://arxiv.org/abs/2402.11301', code='https://github.com/ADiko1997/ReViT',
                  readme='docs/residual_attention.md',
                  architecture=['Residual Attention', 'Window Attention', 'Pooling Attention', 'Vision Transformer']),
    'fan': dict(name='FAN', prefixes=('fan_', ), paper='Understanding The Robustness in Vision Transformers',
                url='https://arxiv.org/abs/2204.12451', code='https://github.com/NVlabs/FAN', readme='docs/fan.md',
                architecture=['Fully Attentional Network', 'Channel Attention', 'Vision Transformer']),
    'rmt': dict(name='RMT', prefixes=('rmt_', ), paper='RMT: Retentive Networks Meet Vision Transformers',
                url='https://arxiv.org/abs/2309.11523', code='https://github.com/qhfan/RMT', readme='docs/rmt.md',
                architecture=['Manhattan Self-Attention', 'Spatial Decay', 'Vision Transformer']),
    'evt': dict(name='EVT', prefixes=('evt_', ), paper='Advancing Vision Transformer with Enhanced Spatial Priors',
                url='https://arxiv.org/abs/2604.18549', code=None, readme='docs/evt.md',
                architecture=['Euclidean Self-Attention', 'Spatial Decay', 'Vision Transformer']),
    'shunted': dict(name='Shunted Transformer', prefixes=('shunted_', ),
                    paper='Shunted Self-Attention via Multi-Scale Token Aggregation',
                    url='https://arxiv.org/abs/2111.15193', code='https://github.com/OliverRensu/Shunted-Transformer',
                    readme='docs/shunted.md', architecture=['Shunted Self-Attention', 'Vision Transformer']),
}
# recipe key -> (dataset, tasks)
_DATA = {'mask_rcnn_1x': ('COCO', ('Object Detection', 'Instance Segmentation')),
         'mask_rcnn_3x': ('COCO', ('Object Detection', 'Instance Segmentation')),
         'cascade_mask_rcnn_3x': ('COCO', ('Object Detection', 'Instance Segmentation')),
         'retinanet_1x': ('COCO', ('Object Detection', )),
         'upernet_160k_ade20k': ('ADE20K', ('Semantic Segmentation', )),
         'fpn_80k_ade20k': ('ADE20K', ('Semantic Segmentation', )),
         'segformer_160k_cityscapes': ('Cityscapes', ('Semantic Segmentation', )),
         'imagenet': ('ImageNet-1k', ('Image Classification', ))}
# the metrics of a reported result that belong to each task
_TASK_METRICS = {'Object Detection': ('box AP', 'AP'), 'Instance Segmentation': ('mask AP', ),
                 'Semantic Segmentation': ('mIoU', ), 'Image Classification': ('top-1', )}
_URL = re.compile(r'https://\S+?\.(?:pth|pyth|pth\.tar)\b')


def family_of(token: str) -> str:
    return next(key for key, family in FAMILIES.items() if token.startswith(family['prefixes']))


def _preset(config_dir: str, token: str) -> Config:
    return Config.fromfile(osp.join(config_dir, '_base_', 'backbones', f'{token}.py'))


def _weights_url(source: str) -> Optional[str]:
    """The official release file named in a preset's ``pretrained_source``, if it names a downloadable one."""
    match = _URL.search(source.replace("'", ''))
    return match.group(0) if match else None


def _model(token: str, preset: Config, recipe: Recipe, zoo: dict) -> dict:
    """The model entry of ``recipe`` with the backbone preset ``token`` (its config ``preset``)."""
    from .analysis.paper_results import reported
    key = recipe_key(recipe)
    name = recipe.name.format(bb=token)
    dataset, tasks = _DATA[key]
    meta = {'Backbone': preset.preset.name, 'Training Data': dataset}
    if key in SCHEDULES:
        schedule, train = SCHEDULES[key], recipe_for(token, key)
        meta['Training Resources'] = f'{GPUS} GPUs x {train.images_per_gpu} images'
        meta.update({'Epochs': schedule.max_epochs} if schedule.max_epochs else {'Iterations': schedule.max_iters})
        meta['Pretrained'] = preset.pretrained_source
    else:
        meta['Training Resources'] = f'total batch {preset.preset.cls.batch_size}'
        meta['Epochs'] = 300
    measured = zoo.get(name, {})
    if measured.get('params'):
        meta['Parameters'] = measured['params']
    if measured.get('macs'):
        meta['FLOPs'] = measured['macs']
        meta['FLOPs input'] = 'x'.join(str(s) for s in reversed(measured['input_hw']))
    entry = {'Name': name, 'In Collection': FAMILIES[family_of(token)]['name'], 'Config': f'configs/{name}.py',
             'Metadata': meta}
    paper = reported(token, key)
    results = []
    for task in tasks:
        metrics = {m: v for m, v in (paper.metrics.items() if paper else ()) if m in _TASK_METRICS[task]}
        if metrics:
            results.append({'Task': task, 'Dataset': dataset, 'Metrics': metrics})
        # a metric named '<dataset> <metric>' is the same model evaluated on another dataset (robustness sets)
        for name_metric, value in (paper.metrics.items() if paper else ()):
            other, _, metric = name_metric.rpartition(' ')
            if other and metric in _TASK_METRICS[task]:
                results.append({'Task': task, 'Dataset': other, 'Metrics': {metric: value}})
    if results:
        entry['Results'] = results
        entry['Results source'] = paper.source
        if paper.note:
            entry['Results note'] = paper.note
    weights = _weights_url(preset.pretrained_source) if key == 'imagenet' else None
    if weights:
        entry['Weights'] = weights
    return entry


def metafiles(config_dir: str, zoo_json: str) -> Dict[str, str]:
    """``{path relative to the repository root: text}`` of the model index and every family's metafile."""
    with open(zoo_json) as f:
        zoo = json.load(f).get('configs', {})
    configs = set(expected_configs(config_dir))
    models: Dict[str, List[dict]] = {key: [] for key in FAMILIES}
    for token in backbone_tokens(config_dir):
        preset = _preset(config_dir, token)
        for recipe in RECIPES:
            if f'{recipe.name.format(bb=token)}.py' in configs:
                models[family_of(token)].append(_model(token, preset, recipe, zoo))
    files = {}
    for key, family in FAMILIES.items():
        collection = {'Name': family['name'],
                      'Metadata': {'Architecture': family['architecture']},
                      'Paper': {'Title': family['paper'], 'URL': family['url']},
                      'README': family['readme']}
        if family['code']:
            collection['Code'] = {'URL': family['code']}
        text = yaml.safe_dump({'Collections': [collection], 'Models': sorted(models[key], key=lambda m: m['Name'])},
                              sort_keys=False, width=120, allow_unicode=True)
        files[f'configs/{METAFILE_DIR}/{key}.yml'] = ('# Written by tools/misc/generate_configs.py from '
                                                      'mmvisatt/metafiles.py: edit that, not this.\n' + text)
    files['model-index.yml'] = yaml.safe_dump({'Import': sorted(p for p in files)}, sort_keys=False)
    return files
