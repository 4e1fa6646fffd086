"""Every task config (discovered, not listed) loads, matches its template, builds whole in its library's scope
(backbone one block per stage), feeds its neck / heads the channels the backbone really produces and trains a step
on a tiny synthetic batch; one config per recipe and backbone form also applies its recipe's weight-decay rules."""
import glob
import logging
import os.path as osp

import pytest
import torch
from mmengine.config import Config
from mmengine.logging import MMLogger
from mmengine.model import revert_sync_batchnorm
from mmengine.optim import build_optim_wrapper
from mmengine.registry import DefaultScope, init_default_scope
from mmengine.structures import PixelData

from conftest import CONFIGS
import mmvisatt.models  # noqa: F401  (registers the backbones in the root registry)
from mmvisatt.engine.entrypoints import resolve_amp
from mmvisatt.task_configs import RECIPES, backbone_tokens, expected_configs, recipe_scope, recipes_page

CONFIG_FILES = sorted(glob.glob(osp.join(CONFIGS, '*.py')))


def _load(path: str) -> Config:
    cfg = Config.fromfile(path)
    # nothing can be downloaded in CI; the init path is covered by the checkpoint tests
    cfg.model.backbone.init_cfg = None
    # the fp16 recipes train in float32 here, as tools/train.py runs them without a GPU
    resolve_amp(cfg)
    if cfg.get('data_preprocessor'):
        # as the Runner does for mmpretrain configs
        cfg.model.setdefault('data_preprocessor', cfg.data_preprocessor)
    return cfg


def _shallow(cfg: Config) -> None:
    """One block per stage (two for single-stage ViTs, whose residual gate acts from the second block on), same
    widths: the plumbing of the config is unchanged, the step costs a fraction. The full-depth presets are built
    by each family's parameter-count tests."""
    from mmvisatt.testing.cases import resolve_arch
    backbone = cfg.model.backbone
    arch = resolve_arch(backbone.type, backbone.get('arch', 't'))
    for key in ('depths', 'depth'):
        if isinstance(arch.get(key), (list, tuple)):
            arch[key] = [1] * len(arch[key])
        elif isinstance(arch.get(key), int):
            arch[key] = 2
    if 'out_block' in arch:  # FAN-Hybrid's stride-16 tap
        arch['out_block'] = 1
    backbone.arch = arch


def _tiny_training(cfg: Config) -> None:
    """Sample few RoIs and proposals: the heads keep their structure, the step costs a fraction."""
    train_cfg = cfg.model.get('train_cfg') or {}
    rcnn = train_cfg.get('rcnn')
    for stage in rcnn if isinstance(rcnn, list) else [rcnn] if rcnn else []:
        stage.sampler.num = 16
    if train_cfg.get('rpn_proposal'):
        train_cfg.rpn_proposal.update(nms_pre=200, max_per_img=50)


def test_configs_are_the_generated_ones():
    expected = expected_configs(CONFIGS)
    on_disk = {osp.basename(p) for p in CONFIG_FILES}
    assert on_disk == set(expected), 'run tools/misc/generate_configs.py (and delete configs without a template)'
    for name, text in expected.items():
        assert open(osp.join(CONFIGS, name)).read() == text, f'{name} differs from its template'


def test_recipe_page_is_the_generated_one():
    page = osp.join(osp.dirname(CONFIGS), 'docs', 'recipes.md')
    assert open(page).read() == recipes_page(CONFIGS), 'run tools/misc/generate_configs.py'


def test_every_backbone_has_every_recipe():
    tokens = backbone_tokens(CONFIGS)
    assert {'revit_b', 'reswin_t', 'reswin_s', 'reswin_b', 'remvit_t', 'remvit_s', 'remvit_b', 'rmt_t', 'rmt_s',
            'rmt_b', 'rmt_l', 'evt_t', 'evt_s', 'evt_b', 'evt_l', 'evt_swin_t', 'shunted_t', 'shunted_s',
            'shunted_b'} <= set(tokens)
    names = {osp.basename(p)[:-3] for p in CONFIG_FILES}
    assert {r.name.format(bb=t) for t in tokens for r in RECIPES if r.applies_to(t)} <= names
    assert {f'segformer_fan_hybrid_{s}_160k_cityscapes' for s in 'tsbl'} <= names
    assert 'mask_rcnn_remvit_t_3x' in names and 'cascade_mask_rcnn_reswin_t_3x' in names


def _custom_imports(scope: str) -> dict:
    # the detection runtime also imports SyncAvgRetinaHead (mmvisatt.models does not import mmdet)
    extra = ['mmvisatt.models.dense_heads'] if scope == 'mmdet' else []
    return dict(imports=['mmvisatt.models', *extra, 'mmvisatt.engine', 'mmvisatt.datasets.transforms'],
                allow_failed_imports=False)


def _scope_of(path: str) -> str:
    name = osp.basename(path)[:-3]
    return next(recipe_scope(r) for r in RECIPES
                for t in backbone_tokens(CONFIGS) if r.name.format(bb=t) == name)


def _consumers(cfg: Config):
    """The channels the config says each backbone output has (neck or heads reading the backbone directly)."""
    model = cfg.model
    if model.type == 'ImageClassifier':
        return [model.neck.in_channels if model.get('neck') and 'in_channels' in model.neck
                else model.head.in_channels]
    if model.get('neck'):
        return list(model.neck.in_channels)
    return list(model.decode_head.in_channels)


def _det_step(model):
    from mmdet.testing import demo_mm_inputs
    batch = demo_mm_inputs(batch_size=1, image_shapes=[(3, 64, 96)], num_items=[2], num_classes=80,
                           with_mask=True)
    return model(**model.data_preprocessor(batch, True), mode='loss')


def _seg_step(model):
    from mmseg.structures import SegDataSample
    # two images: the pyramid pooling's 1x1 BatchNorm needs more than one value per channel
    images = [torch.randint(0, 255, (3, 64, 80), dtype=torch.uint8) for _ in range(2)]
    samples = []
    for _ in images:
        labels = torch.randint(0, model.decode_head.num_classes, (1, 64, 80))
        sample = SegDataSample(gt_sem_seg=PixelData(data=labels))
        sample.set_metainfo(dict(img_shape=(64, 80), ori_shape=(64, 80), pad_shape=(64, 80)))
        samples.append(sample)
    model.data_preprocessor.size = (64, 80)
    return model(**model.data_preprocessor(dict(inputs=images, data_samples=samples), True), mode='loss')


def _cls_step(model):
    from mmpretrain.structures import DataSample
    images = [torch.randint(0, 255, (3, 64, 64), dtype=torch.uint8) for _ in range(2)]
    samples = [DataSample().set_gt_label(i) for i in (3, 7)]
    return model(**model.data_preprocessor(dict(inputs=images, data_samples=samples), True), mode='loss')


STEPS = {'mmdet': _det_step, 'mmseg': _seg_step, 'mmpretrain': _cls_step}


def _representatives():
    """One config per recipe and backbone form (the smallest preset: reswin_t for ReSwin-T/S/B, fan_hybrid_t for
    FAN-Hybrid, ...): the presets of a form differ only in preset values, which every config's build checks."""
    order = {'t': 0, 's': 1, 'b': 2, 'l': 3}
    smallest = {}
    for token in backbone_tokens(CONFIGS):
        form, size = token.rsplit('_', 1)
        if form not in smallest or order[size] < order[smallest[form].rsplit('_', 1)[1]]:
            smallest[form] = token
    return {r.name.format(bb=t) + '.py' for t in smallest.values() for r in RECIPES if r.applies_to(t)}


REPRESENTATIVES = _representatives()


def _build(path: str):
    cfg = _load(path)
    _shallow(cfg)
    _tiny_training(cfg)
    scope = _scope_of(path)
    assert cfg.default_scope == scope
    assert cfg.custom_imports == _custom_imports(scope)
    init_default_scope(scope)
    from mmengine.registry import MODELS
    torch.manual_seed(0)
    with DefaultScope.overwrite_default_scope(scope):
        # as the Runner does outside distributed training (the heads use SyncBN)
        model = revert_sync_batchnorm(MODELS.build(cfg.model))
    return cfg, scope, model


def test_every_config_passes_the_key_and_class_checks_of_tools_train():
    """tools/train.py refuses top-level keys that are typos of Runner keys, and heads whose num_classes differ
    from the datasets' classes: no shipped config may trip either (the data files are absent here, so only the
    config-level checks of the pre-flight run)."""
    from mmvisatt.engine.entrypoints import import_task_library
    from mmvisatt.engine.preflight import check_top_level_keys
    from mmvisatt.engine.preflight import check_dataset_contents, head_num_classes
    for path in CONFIG_FILES:
        cfg = Config.fromfile(path)
        check_top_level_keys(cfg, path)
        assert head_num_classes(cfg.model), path
        assert check_dataset_contents(cfg, import_task_library(cfg)) == [], path


@pytest.mark.parametrize('path', CONFIG_FILES, ids=osp.basename)
def test_config_builds_wires_and_trains_one_step(path):
    """Every config loads in its library's scope, builds whole, feeds its neck / heads the channels the backbone
    really produces, and trains a step on a tiny synthetic batch: finite losses, finite gradients, and a gradient
    for every trainable backbone parameter (DDP stops otherwise; find_unused_parameters is off). One config per
    recipe and backbone form also checks the recipe's weight-decay rules (the presets of a form share them)."""
    cfg, scope, model = _build(path)
    from mmvisatt.engine.preflight import LEGACY_KEYS
    assert not [key for key in LEGACY_KEYS if key in cfg], 'mmdet 2.x keys would be refused by tools/train.py'
    model.train()
    outputs = []
    hook = model.backbone.register_forward_hook(lambda module, args, output: outputs.append(output))
    with DefaultScope.overwrite_default_scope(scope):
        losses = STEPS[scope](model)
    hook.remove()
    feats = outputs[0] if isinstance(outputs[0], (list, tuple)) else [outputs[0]]
    assert [f.shape[1] for f in feats] == _consumers(cfg), 'neck/head in_channels != backbone outputs'
    total, _ = model.parse_losses(losses)
    assert torch.isfinite(total)
    total.backward()
    grads = [p.grad for n, p in model.named_parameters() if n.startswith('backbone.') and p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    unused = [n for n, p in model.backbone.named_parameters() if p.requires_grad and p.grad is None]
    assert not unused, unused[:5]
    if osp.basename(path) in REPRESENTATIVES:
        _check_decay_rules(cfg, model)


def _check_decay_rules(cfg: Config, model) -> None:
    """The recipe's no-decay names get no weight decay; other backbone weights get the recipe's."""
    logger = MMLogger.get_current_instance()
    level = logger.level
    logger.setLevel(logging.WARNING)  # the constructor logs a line per parameter
    try:
        optim = build_optim_wrapper(model, cfg.optim_wrapper).optimizer
    finally:
        logger.setLevel(level)
    decay = {id(p): g['weight_decay'] for g in optim.param_groups for p in g['params']}
    names = dict(model.named_parameters())
    paramwise = cfg.optim_wrapper.get('paramwise_cfg') or {}
    keys = [k for k, v in (paramwise.get('custom_keys') or {}).items() if v.get('decay_mult', 1) == 0]
    no_decay = [n for n in names if n.startswith('backbone.') and any(k in n for k in keys)]
    # a name may belong to one task's model only (FAN-ViT's class token exists in its classifier alone)
    assert no_decay or not keys, 'no no_decay name matches a parameter'
    assert ('backbone.alpha' in no_decay) == ('backbone.alpha' in names)
    assert all(decay[id(names[n])] == 0 for n in no_decay)
    weight = next(n for n, p in names.items()
                  if n.startswith('backbone.') and p.ndim > 1 and n not in no_decay and 'norm' not in n)
    assert decay[id(names[weight])] == pytest.approx(cfg.optim_wrapper.optimizer.weight_decay)
