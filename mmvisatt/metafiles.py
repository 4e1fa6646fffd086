"""The OpenMMLab model index: ``model-index.yml`` and one metafile per family (``configs/metafiles/<family>.yml``).

``mim search mmvisatt`` and ``mim train mmvisatt CONFIG`` read them from an installed package's ``mmvisatt/.mim``
(``setup.py`` puts the configs, the tools and the index there). Every task config is one model entry: its
collection (the family), config file, training data, schedule and resources, parameters and FLOPs as the model zoo
measured them (``docs/model_zoo.json``, multiply-adds at the zoo's input size), the results the paper or the
official repository reports for that recipe (``mmvisatt.analysis.paper_results``, with their source; none where
nothing is reported), and the official ImageNet weights: the release URL as ``Weights`` of the ImageNet
classifier, and where a dense config's backbone comes from. Written by ``tools/misc/generate_configs.py``; a test
keeps the checked-in files equal to what this module writes. :func:`weights_page` writes docs/weights.md from the
same presets: where each backbone's ImageNet weights are and how the configs get them.
"""
import json
import os.path as osp
import re
from typing import Dict, List, Optional

import yaml
from mmengine.config import Config

from .recipes import SCHEDULES, recipe_for
from .task_configs import RECIPES, Recipe, backbone_tokens, expected_configs, literal, recipe_key

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
        meta['Training Resources'] = f'{train.gpus} GPUs x {train.images_per_gpu} images'
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


_RECIPE_LABELS = {'mask_rcnn_1x': 'Mask R-CNN 1x', 'mask_rcnn_3x': 'Mask R-CNN 3x',
                  'cascade_mask_rcnn_3x': 'Cascade 3x', 'retinanet_1x': 'RetinaNet 1x',
                  'upernet_160k_ade20k': 'UperNet', 'fpn_80k_ade20k': 'Semantic FPN',
                  'segformer_160k_cityscapes': 'SegFormer (Cityscapes)', 'imagenet': 'ImageNet'}


#: the licence of each source of released weights, by preset prefix, with where it is stated
_WEIGHT_LICENCES = (
    (('revit_b', 'reswin_t', 'remvit_t'),
     'none stated (ADiko1997/ReViT@06da93a has no licence file or statement): ask the authors before uses beyond '
     'research'),
    (('reswin_s', 'reswin_b'), 'MIT (the LICENSE of microsoft/Swin-Transformer)'),
    (('remvit_s', 'remvit_b'), 'Apache-2.0 (facebookresearch/mvit@1f9d29b:README.md, "License")'),
    (('fan_',), 'NVIDIA Source Code License-NC: research or evaluation only (NVlabs/FAN@6467085:LICENSE, 3.3)'),
    (('rmt_',), 'none stated (qhfan/RMT@0d09dad: README.md, no licence file): ask the authors before uses beyond '
                'research'),
    (('shunted_',), 'none stated (OliverRensu/Shunted-Transformer@999e268: README.md, no licence file): ask the '
                    'authors before uses beyond research'),
)


def weight_licence(token: str) -> str:
    """The licence of the weights the preset ``token`` starts from, with where it is stated."""
    return next(text for prefixes, text in _WEIGHT_LICENCES if token.startswith(prefixes))


def weights_page(config_dir: str) -> str:
    """docs/weights.md: per backbone preset, where its ImageNet weights come from and how the configs get them
    (a direct download the first run fetches, a manual step, or none released), under which licence, which configs
    start from them and for which of those recipes the paper reports numbers; then the commands that fetch the
    Google Drive files on a node without a browser."""
    from .analysis.paper_results import reported
    configs = set(expected_configs(config_dir))
    lines = ['# Pretrained weights', '',
             '<!-- Written by tools/misc/generate_configs.py from the presets in configs/_base_/backbones/: edit '
             'those, not this. -->', '',
             "Every dense config starts its backbone from the preset's ImageNet weights "
             "(`model.backbone.init_cfg.checkpoint`). A file the authors released as a direct download is named by "
             "its URL: the pre-flight of the first run downloads it once (timeouts, retries, checked before it is "
             'kept) into a cache keyed by the whole URL (`$TORCH_HOME/hub/checkpoints/mmvisatt/<hash of the URL>/`, '
             'default `~/.cache/torch/hub/checkpoints/...`; the first process per cache downloads and the others '
             'wait; [reliability.md](reliability.md#checkpoints-named-by-url)), then it goes through the converter '
             'and the load report as a local file does. A file behind Google '
             'Drive or Baidu Pan is a local path under `checkpoints/`: download it there by hand (the pre-flight '
             'names the file and where to get it when it is missing; [below](#on-a-node-without-a-browser), the '
             'commands for Google Drive). Where no weights were released, train the preset\'s ImageNet config first '
             'and point `init_cfg.checkpoint` at its checkpoint. Another file: '
             '`--cfg-options model.backbone.init_cfg.checkpoint=PATH_OR_URL`.', '',
             "The weights are the authors', under their terms, not under this package's Apache-2.0 licence: the "
             'licence column says what each source states. A model fine-tuned from them is a derivative of them.', '',
             '| preset | weights | how the configs get them | licence of the weights | configs | paper reports |',
             '|---|---|---|---|---|---|']
    counts = {'direct': 0, 'manual': 0, 'none': 0}
    drive = []
    for token in backbone_tokens(config_dir):
        preset = _preset(config_dir, token)
        source, path = preset.pretrained_source, preset.pretrained
        names = [r.name.format(bb=token) for r in RECIPES if f'{r.name.format(bb=token)}.py' in configs]
        dense = [n for n in names if not n.startswith('imagenet')]
        if path.startswith(('http://', 'https://')):
            kind, how = 'direct', 'downloaded by the first run'
            where = f'[{osp.basename(path)}]({path})'
        elif source.startswith('no '):
            kind, how, where = 'none', f'none released: train `configs/imagenet_{token}.py` first', '-'
        else:
            kind, how, where = 'manual', f'by hand, to `{path}`', source
        if preset.get('pretrained_gdown'):
            drive.append(f'gdown {preset.pretrained_gdown} -O {path}   # {preset.preset.name}')
        counts[kind] += len(dense)
        papers = sorted({_RECIPE_LABELS[recipe_key(r)] for r in RECIPES
                         if f'{r.name.format(bb=token)}.py' in configs and reported(token, recipe_key(r))})
        licence = '-' if kind == 'none' else weight_licence(token)
        lines.append(f'| {preset.preset.name} (`{token}`) | {where} | {how} | {licence} | {len(dense)} dense + '
                     f"ImageNet | {', '.join(papers) or '-'} |")
    lines += ['', f"Of the {sum(counts.values())} dense configs, {counts['direct']} download their weights, "
              f"{counts['manual']} need a file copied by hand and {counts['none']} need an ImageNet run first.", '',
              '## On a node without a browser', '',
              'Google Drive files download with [gdown](https://pypi.org/project/gdown/) (`pip install gdown`), by '
              'the file ids of the links in the official READMEs, from the repository root:', '', '```bash']
    lines += drive + ['# Shunted-T/S/B: the whole Google Drive folder, then ckpt_T.pth, ckpt_S.pth, ckpt_B.pth into '
                      'checkpoints/',
                      'gdown --folder 15iZKXFT7apjUSoN2WUMAbb0tvJgyh3YP -O checkpoints/shunted', '```', '',
                      "RMT's weights are on Baidu Pan only: download them on a machine with a browser and copy them "
                      'over.', '']
    return '\n'.join(lines)


def _memory_settings_lines(tokens: List[str], presets: Dict[str, Config]) -> List[str]:
    """What the dense recipes of ``tokens`` add to the backbone to fit one 80 GB GPU at their images per GPU, one
    line per preset that has any: a block pasted into a config of the same task and batch needs the same."""
    lines = []
    for token in tokens:
        added = {}
        for recipe in RECIPES:
            if recipe.task != 'cls' and recipe.applies_to(token):
                values = recipe_for(token, recipe_key(recipe))
                settings = ', '.join(f'{k}={v!r}' for k, v in values.backbone.items()
                                     if k in ('with_cp', 'score_memory'))
                if values.memory and settings:
                    added.setdefault(settings, []).append(f'`{recipe.name.format(bb=token)}.py`')
        for settings, names in added.items():
            lines.append(f'- {presets[token].name} in {", ".join(sorted(names))}: add `{settings}` to the backbone; '
                         f'at those configs\' images per GPU the training step is over 80 GB without '
                         f'{"them" if "," in settings else "it"} (docs/benchmarks.md, Memory per GPU).')
    return lines


#: the torch the test suite runs on (tools/setup_plan.py installs it where none is there) and the oldest accepted
TORCH_TESTED, TORCH_MIN = '2.14.1', '2.6'


def _optimizer_summary(optim_wrapper: dict) -> str:
    """AdamW lr 0.0001, wd 0.05, AMP: the optimizer of a shipped config in a table cell."""
    optimizer = optim_wrapper['optimizer']
    parts = [f"{optimizer['type']} lr {optimizer['lr']:g}", f"wd {optimizer.get('weight_decay', 0):g}"]
    decay = (optim_wrapper.get('paramwise_cfg') or {}).get('layer_decay_rate')
    if decay:
        parts.append(f'layer decay {decay:g}')
    if optim_wrapper.get('clip_grad'):
        parts.append(f"clip {optim_wrapper['clip_grad'].get('max_norm')}")
    parts.append('AMP fp16' if optim_wrapper.get('type') == 'AmpOptimWrapper' else 'float32')
    return ', '.join(parts)


def own_project_config(config_dir: str, token: str) -> Config:
    """The Mask R-CNN 1x config of preset ``token``: what the own-project block of that preset copies."""
    return Config.fromfile(osp.join(config_dir, f'mask_rcnn_{token}_1x.py'))


def own_project_block(config_dir: str, token: str) -> str:
    """The block to paste into an mmdet config for preset ``token``: the imports, the backbone and the optimizer
    exactly as ``configs/mask_rcnn_{token}_1x.py`` sets them, and the neck's input channels."""
    cfg = own_project_config(config_dir, token)
    backbone = dict(_delete_=True, **cfg.model.backbone.to_dict())
    optim = dict(_delete_=True, **cfg.optim_wrapper.to_dict())
    channels = list(cfg.model.neck.in_channels)
    return '\n'.join([
        "custom_imports = dict(imports=['mmvisatt.models', 'mmvisatt.engine', 'mmvisatt.datasets.transforms'], "
        'allow_failed_imports=False)',
        'model = dict(',
        '    backbone=' + literal(backbone, 4, 13) + ',',
        f'    # mmdet: FPN; mmseg UperNet: decode_head=dict(in_channels={channels}), '
        f'auxiliary_head=dict(in_channels={channels[2]})',
        f'    neck=dict(in_channels={channels}))',
        'optim_wrapper = ' + literal(optim, 0, 16)])


def own_project_page(config_dir: str) -> str:
    """docs/own_project.md: what the package needs beside a project's own mmdet / mmseg; per backbone class the
    block to paste (the backbone and the optimizer of the preset's shipped Mask R-CNN 1x config, the neck's
    channels, the imports) and every preset's values with the licence of its weights; then what the stock
    ``tools/train.py`` lacks beside this package's."""
    from .stack import STACK_NAMES, STACKS
    presets = {token: _preset(config_dir, token).preset for token in backbone_tokens(config_dir)}
    by_class: Dict[str, List[str]] = {}
    for token, preset in presets.items():
        by_class.setdefault(preset.backbone.type, []).append(token)
    names = ('mmcv', 'mmengine', 'mmdet', 'mmseg', 'mmpretrain')
    lines = ['# The backbones in your own mmdet or mmseg project', '',
             '<!-- Written by tools/misc/generate_configs.py from the presets and configs in configs/: edit those, '
             'not this. -->', '',
             '## What your environment needs', '',
             f'- **torch {TORCH_MIN} or newer.** Every checkpoint is read with `torch.load(weights_only=True)`, whose '
             f'loader could run code from a file before torch {TORCH_MIN} (CVE-2025-32434). The tests run on torch '
             f'{TORCH_TESTED}; {TORCH_MIN} to {TORCH_TESTED} are accepted, and the releases between were not '
             'tested.',
             f'- **Upgrade torch before installing this package.** With an older torch, `pip install -e .` installs '
             f'a torch >= {TORCH_MIN} from PyPI under the mmcv you built for the old one, whose compiled ops then '
             "fail to load. Install your CUDA's torch build first (pytorch.org), rebuild mmcv for it "
             '(`MMVISATT_VENV=none bash tools/setup_env.sh --user --plan` says what it would do and stops on what '
             'would fail), then `pip install -e .` in the checkout: it names no OpenMMLab distribution and replaces '
             'nothing of your stack.',
             '- **One of two stacks, in these ranges** (`mmvisatt/stack.py`; `tools/check_install.py` names what '
             'is outside them):', '',
             '| library | ' + ' | '.join(STACK_NAMES[k] for k in STACKS) + ' |',
             '|---|' + '---|' * len(STACKS)]
    for name in names:
        lines.append(f'| {name} | ' + ' | '.join(f'`{STACKS[k][name].requirement()}`' for k in STACKS) + ' |')
    lines += ['',
              "- **What the imports change.** `custom_imports` registers the backbones in mmengine's root registry, "
              "the pipelines' `LoadCheckedImageFromFile` and the hooks below; importing `mmvisatt.engine` also "
              "makes this package's safe loader mmengine's checkpoint loader for local files and URLs, in the whole "
              'process: every `load_checkpoint`, your own models\' too, then refuses a file that holds more than '
              'tensors and plain data, with its path and the reason.', '',
              '## The blocks', '',
              'A config of your own project uses a backbone by its registered name. Paste the block of its class '
              'over your model: it sets the backbone and the optimizer as the preset\'s Mask R-CNN 1x config in '
              '`configs/` does (drop path, SyncBN, the checkpoint and its key, the optimizer with its '
              'parameter-wise rules and the precision), and the neck\'s (or UperNet\'s) input channels. Keep your '
              'data, schedule and heads. The other recipes (3x, Cascade, RetinaNet, UperNet) set other values: '
              'their configs in `configs/` and [recipes.md](recipes.md) have them. The weights are the authors\', '
              'under the licence each row names ([weights.md](weights.md)).', '']
    for cls, tokens in by_class.items():
        # the tiny preset where there is one (the one to try first)
        example = next((t for t in tokens if t.endswith('_t')), tokens[0])
        lines += [f'## {cls}', '', f"{', '.join(presets[t].name for t in tokens)}. The block for "
                  f'{presets[example].name} (`configs/mask_rcnn_{example}_1x.py`):', '',
                  '```python', own_project_block(config_dir, example), '```', '',
                  '| preset | backbone arguments | optimizer | neck in_channels | licence of the weights |',
                  '|---|---|---|---|---|']
        for token in tokens:
            cfg = own_project_config(config_dir, token)
            arguments = ', '.join(f'{k}={v!r}' for k, v in cfg.model.backbone.items() if k not in ('type', 'init_cfg'))
            released = not _preset(config_dir, token).pretrained_source.startswith('no ')
            licence = weight_licence(token).split(' (')[0] if released else 'none released'
            lines.append(f'| {presets[token].name} (`{token}`) | `{arguments}` | '
                         f'{_optimizer_summary(cfg.optim_wrapper)} | `{list(cfg.model.neck.in_channels)}` | '
                         f'{licence} |')
        memory = _memory_settings_lines(tokens, presets)
        lines += ['', *memory, ''] if memory else ['']
    lines += ['## What the stock tools/train.py lacks', '',
              "mmdet's and mmseg's own `tools/train.py` train these configs. This package's `tools/train.py` adds, "
              'before the Runner is built, the pre-flight (the config, the data and the checkpoints checked, each '
              'problem named with its fix: [reliability.md](reliability.md)) and `--demo`; and, in the Runner, '
              'checkpoints written atomically with the RNG states of every rank, so that `--resume` continues '
              'exactly (`AtomicCheckpointHook`, `ExactResumeHook`), a check of the neck\'s channels against the '
              'backbone\'s outputs at the first iteration (`ChannelCheckHook`) and the CPU fallbacks of SyncBN and '
              'fp16. With the stock tools, add the hooks to your config, with the interval of its loop:', '',
              '```python',
              '# epoch-based (mmdet): a checkpoint every epoch',
              "default_hooks = dict(checkpoint=dict(type='AtomicCheckpointHook', interval=1, max_keep_ckpts=3))",
              '# iteration-based (mmseg): every 16,000 iterations, as its 160k schedules',
              "default_hooks = dict(checkpoint=dict(type='AtomicCheckpointHook', by_epoch=False, interval=16000, "
              'max_keep_ckpts=3))',
              "custom_hooks = [dict(type='ExactResumeHook'), dict(type='ChannelCheckHook')]",
              '```', '',
              '`max_keep_ckpts` keeps the newest three (each Mask R-CNN checkpoint, with its optimizer state, is a few '
              'hundred MB). To resume inside an epoch too, an epoch-based config also needs the loop that can '
              'start an epoch at its next batch, and the hook saving inside epochs:', '',
              '```python',
              "train_cfg = dict(type='ResumableEpochBasedTrainLoop', max_epochs=12, val_interval=1)",
              "default_hooks = dict(checkpoint=dict(type='AtomicCheckpointHook', interval=1, mid_epoch_interval=2000, "
              'mid_epoch_max_keep=2))',
              '```', '']
    return '\n'.join(lines)


# family -> what it is for, in a line (docs/choosing.md)
_FAMILY_USE = {
    'revit': 'Swin, MViTv2 and ViT with each layer\'s attention scores carried into the next: ReSwin-T is Swin-T plus '
             'one mix per block, the closest to what mmdet users train today; ReViT-B is a plain ViT-B (global '
             'attention at every block: the most memory per image).',
    'fan': 'Robustness to corruptions (ImageNet-C, COCO-C): channel attention after token attention; the Hybrid '
           'forms (a ConvNeXt stem) are the ones with official detection and segmentation numbers.',
    'rmt': 'the strongest reported COCO and ADE20K numbers here: attention with a Manhattan-distance spatial decay, '
           'decomposed along the axes in the early stages. Its ImageNet weights are on Baidu Pan only (a browser and '
           'a Baidu account; weights.md).',
    'evt': 'RMT\'s decay with Euclidean distance and 1-D token groups; built from the paper (no released code or '
           'weights: ImageNet pre-training first).',
    'shunted': 'several key/value resolutions in one attention layer, for objects of many sizes; cheap in memory.',
}


def choosing_page(config_dir: str, zoo_json: str, memory_json: str) -> str:
    """docs/choosing.md: per family, what it is for, each preset's size (parameters and FLOPs of its Mask R-CNN 1x
    config), what its paper reports, whether official weights exist, the per-GPU memory of its Mask R-CNN 1x config
    where measured, and the configs to start from."""
    from .analysis.paper_results import reported
    with open(zoo_json) as f:
        zoo = json.load(f).get('configs', {})
    memory = {}
    if osp.isfile(memory_json):
        with open(memory_json) as f:
            data = json.load(f)
        memory = {name[:-3]: row for name, row in data.get('rows', {}).items()}
    lines = ['# Choosing a backbone and a config', '',
             '<!-- Written by tools/misc/generate_configs.py from the presets, docs/model_zoo.json, '
             'docs/config_memory.json and mmvisatt/analysis/paper_results.py: edit those, not this. -->', '',
             'Per family: what it is for, and per preset the size of its Mask R-CNN 1x detector (parameters; FLOPs '
             'as multiply-adds at the model zoo\'s 1280x800 input, [model_zoo.md](model_zoo.md)), what the paper or '
             'official repository reports for its dense recipes (COCO box AP, ADE20K or Cityscapes mIoU; "-" where '
             'nothing is reported), whether official ImageNet weights exist ([weights.md](weights.md)), and the '
             'memory its Mask R-CNN 1x config needs per GPU at its recipe\'s batch '
             '([benchmarks.md](benchmarks.md#memory-per-gpu), an upper bound measured on the CPU). Every preset has '
             'all seven configs (`configs/<recipe>_<preset>_....py`); start from `mask_rcnn_<preset>_3x.py` for '
             'COCO-style detection and `upernet_<preset>_160k_ade20k.py` for segmentation.', '']
    tokens = backbone_tokens(config_dir)
    for key, family in FAMILIES.items():
        use = _FAMILY_USE[key]
        lines += [f"## {family['name']}", '', use[0].upper() + use[1:], '',
                  '| preset | Mask R-CNN 1x: params (M) | FLOPs (G) | reported | official weights | '
                  'memory per GPU (GB, batch) |', '|---|---|---|---|---|---|']
        # by form (ReViT / ReSwin / ReMViTv2, FAN's three), then by size
        members = sorted((t for t in tokens if family_of(t) == key), key=lambda t: (t[:-2], 'tsbl'.index(t[-1])))
        for token in members:
            preset = _preset(config_dir, token)
            det = zoo.get(f'mask_rcnn_{token}_1x', {})
            results = []
            for recipe in RECIPES:
                paper = reported(token, recipe_key(recipe))
                metrics = {m: v for m, v in (paper.metrics.items() if paper else ()) if m in ('box AP', 'AP', 'mIoU')}
                if metrics and recipe_key(recipe) != 'imagenet':
                    results.append(f"{_RECIPE_LABELS[recipe_key(recipe)]} "
                                   + ', '.join(f'{m} {v}' for m, v in metrics.items()))
            weights = 'no' if preset.pretrained_source.startswith('no ') else 'yes'
            row = memory.get(f'mask_rcnn_{token}_1x')
            mem = f"{row['per_gpu'] / 1e9:.1f} ({row['batch_per_gpu']} images)" if row else 'not measured'
            params = f"{det['params'] / 1e6:.1f}" if det.get('params') else '-'
            flops = f"{det['macs'] / 1e9:.0f}" if det.get('macs') else '-'
            lines.append(f"| {preset.preset.name} (`{token}`) | {params} | {flops} | {'; '.join(results) or '-'} | "
                         f'{weights} | {mem} |')
        lines.append('')
    return '\n'.join(lines)
