"""``--demo``: run a detection, segmentation or ImageNet config on the generated demo data.

The model and the recipe (optimizer type, parameter-wise decay rules, the shape of the lr schedule) stay those of
the config; only the data, the image size, the number of classes, the schedule length, the learning rate and the
backbone initialisation change, so a newcomer sees the real pipeline train, evaluate and save a checkpoint in
minutes on a CPU. The demo's whole journey is two runs: an ImageNet config's demo pre-trains the backbone on the
generated classification set, and a dense config's demo starts its backbone from that checkpoint when the command
line names it (``--cfg-options model.backbone.init_cfg.checkpoint=PATH``); otherwise the backbone starts from
random weights, since no ImageNet checkpoint can be fetched here.
"""
import copy
import os.path as osp
import tempfile
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch
from mmengine.config import Config, ConfigDict
from mmengine.dist import is_main_process
from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS


@dataclass(frozen=True)
class DemoSettings:
    """What a demo run shrinks the config to: data, image size, schedule and lr; the model, its optimizer type and
    parameter-wise rules stay the config's.

    The defaults train Mask R-CNN with a Swin-T-sized backbone from scratch on 2 CPU cores in about 10 minutes,
    2 validations of 50 images (iteration 0 and the end) included; see ``tests/test_demo_train.py``. What was
    measured while choosing them is in docs/getting_started.md ("The demo: what it changes and why").
    """
    img_size: int = 128
    # the generated scenes (mmvisatt.datasets.SCENE_STYLES): one large shape per image on a plain background
    style: str = 'single'
    # RoIs sampled per image for the R-CNN heads. The recipes' 512 are sized for ~7 objects on 1333x800 images;
    # the mask head (4 convs over every positive RoI) otherwise dominates a CPU iteration.
    rois_per_image: int = 32
    # Test-time proposals and detections per image, scaled the same way (recipes: 1000 and 100). The mask head
    # runs on every detection, so this sets the cost of a validation.
    proposals_per_image: int = 300
    dets_per_image: int = 20
    max_iters: int = 300
    warmup_iters: int = 25
    lr: float = 2e-4
    # keep the recipe's lr decay (its steps or poly at the same fraction of the run); False: constant lr after the
    # warmup, since a run this short is still far from the point where a decay pays
    keep_decay: bool = False
    batch_size: int = 2
    num_workers: int = 1
    seed: int = 0


#: The classification demo: about two minutes of 2 CPU cores, so that both stages of ``make demo`` fit in 10. That
#: budget is too small for ReSwin-T from random weights to learn the three shapes (docs/getting_started.md, "The
#: demo's journey"); at 56 px its first two stages fill whole 7 x 7 windows, so no compute goes to padding there.
CLASSIFICATION_DEMO = DemoSettings(img_size=56, max_iters=60, warmup_iters=6, lr=1e-3, batch_size=32)


# Position fields of a parameter scheduler, in the unit of its ``by_epoch``.
_SCHEDULER_POSITIONS = ('begin', 'end', 'milestones', 'T_max', 'step_size')


def _cfgs_at(model: ConfigDict, paths: Tuple[str, ...]) -> Iterator[ConfigDict]:
    """Every config dict at the dotted ``paths`` of ``model``; a path may hold a list (cascade stages)."""
    for path in paths:
        node: Any = model
        for key in path.split('.'):
            node = node.get(key) if isinstance(node, dict) else None
        for head in node if isinstance(node, list) else [node]:
            if isinstance(head, dict):
                yield head


def set_num_classes(model: ConfigDict, num_classes: int, paths: Tuple[str, ...]) -> int:
    """Set ``num_classes`` in every head under ``paths`` that has one; returns how many were set."""
    heads = [h for h in _cfgs_at(model, paths) if 'num_classes' in h]
    for head in heads:
        head.num_classes = num_classes
    return len(heads)


def _original_length(cfg: Config) -> Tuple[Optional[float], Optional[float]]:
    """(epochs, iterations) of the config's training run; the one its loop does not count is None."""
    train_cfg = cfg.get('train_cfg') or {}
    if train_cfg.get('by_epoch', 'max_epochs' in train_cfg):
        return train_cfg.get('max_epochs'), None
    return None, train_cfg.get('max_iters')


def _rescale(value: Any, new_length: int, old_length: float) -> Any:
    if isinstance(value, (list, tuple)):
        return [_rescale(v, new_length, old_length) for v in value]
    return max(1, round(value * new_length / old_length))


def _is_warmup(scheduler: dict, index: int) -> bool:
    # by iteration (the dense recipes) or by epoch counted in iterations (the ImageNet recipes)
    by_iter = not scheduler.get('by_epoch', True) or scheduler.get('convert_to_iter_based', False)
    return index == 0 and scheduler.get('type') in ('LinearLR', 'ConstantLR') and by_iter


def shorten_schedule(cfg: Config, settings: DemoSettings) -> None:
    """Make the run ``settings.max_iters`` iterations long.

    A leading linear warmup becomes ``settings.warmup_iters`` long. Without ``settings.keep_decay`` the lr stays
    constant after it (the other schedulers are dropped, with a log line); with it every other scheduler is placed
    at the same fraction of the new run as it had in the old one (so MultiStepLR at epochs 27/33 of 36 decays at 75%
    and 92% of the demo, PolyLR still decays over the whole run), and one whose position cannot be converted
    (iteration-based inside an epoch-based run) is dropped, with a log line.
    """
    n = settings.max_iters
    epochs, iters = _original_length(cfg)
    schedulers: List[dict] = []
    for i, sched in enumerate(copy.deepcopy(cfg.get('param_scheduler') or [])):
        if _is_warmup(sched, i):
            sched.update(begin=0, end=settings.warmup_iters, by_epoch=False)
            sched.pop('convert_to_iter_based', None)
            schedulers.append(sched)
            continue
        if not settings.keep_decay:
            print_log(f'demo: dropping param scheduler {sched.get("type")} (constant lr after the warmup)',
                      logger='current')
            continue
        length = epochs if sched.get('by_epoch', True) else iters
        if not length:
            print_log(f'demo: dropping param scheduler {sched.get("type")} (its position cannot be converted)',
                      logger='current')
            continue
        for key in _SCHEDULER_POSITIONS:
            if key in sched:
                sched[key] = _rescale(sched[key], n, length)
        sched.by_epoch = False
        sched.pop('convert_to_iter_based', None)
        schedulers.append(sched)
    cfg.param_scheduler = schedulers
    cfg.train_cfg = dict(type='IterBasedTrainLoop', max_iters=n, val_interval=n)
    cfg.val_cfg = dict(type='ValLoop')
    cfg.test_cfg = dict(type='TestLoop')
    cfg.setdefault('default_hooks', ConfigDict())
    cfg.default_hooks.checkpoint = dict(type='CheckpointHook', by_epoch=False, interval=n, max_keep_ckpts=1)
    cfg.default_hooks.logger = dict(type='LoggerHook', interval=10)
    cfg.log_processor = dict(type='LogProcessor', window_size=10, by_epoch=False)


def _loader(dataset: dict, settings: DemoSettings, train: bool) -> dict:
    loader = dict(batch_size=settings.batch_size if train else 1, num_workers=settings.num_workers,
                  persistent_workers=settings.num_workers > 0, dataset=dataset,
                  sampler=dict(type='DefaultSampler', shuffle=train))
    if not train:
        loader['drop_last'] = False
    return loader


def _detection_data(cfg: Config, settings: DemoSettings) -> None:
    from mmvisatt.datasets import DEMO_COCO_CLASSES, prepare_demo_coco

    root = prepare_demo_coco(img_size=settings.img_size, style=settings.style)
    heads = ('bbox_head', 'mask_head', 'roi_head.bbox_head', 'roi_head.mask_head')
    if not set_num_classes(cfg.model, len(DEMO_COCO_CLASSES), heads):
        raise ValueError(f'--demo: no num_classes found under model.{{{",".join(heads)}}}')
    with_mask = bool(list(_cfgs_at(cfg.model, ('mask_head', 'roi_head.mask_head'))))
    for rcnn in _cfgs_at(cfg.model, ('train_cfg.rcnn',)):
        if 'num' in rcnn.get('sampler', {}):
            rcnn.sampler.num = settings.rois_per_image
    for key, value in (('rpn', settings.proposals_per_image), ('rcnn', settings.dets_per_image)):
        if 'max_per_img' in cfg.model.get('test_cfg', {}).get(key, {}):
            cfg.model.test_cfg[key].max_per_img = value
    scale = (settings.img_size, settings.img_size)
    train_pipeline = [
        dict(type='LoadCheckedImageFromFile'),
        dict(type='LoadAnnotations', with_bbox=True, with_mask=with_mask),
        dict(type='Resize', scale=scale, keep_ratio=True),
        dict(type='RandomFlip', prob=0.5),
        dict(type='PackDetInputs'),
    ]
    test_pipeline = [
        dict(type='LoadCheckedImageFromFile'),
        dict(type='Resize', scale=scale, keep_ratio=True),
        dict(type='LoadAnnotations', with_bbox=True, with_mask=with_mask),
        dict(type='PackDetInputs', meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor')),
    ]

    def dataset(split: str, pipeline: list) -> dict:
        return dict(type='CocoDataset', data_root=root, ann_file=f'annotations/instances_{split}.json',
                    data_prefix=dict(img=f'{split}/'), metainfo=dict(classes=DEMO_COCO_CLASSES),
                    test_mode=split == 'val', pipeline=pipeline,
                    **(dict(filter_cfg=dict(filter_empty_gt=True, min_size=32)) if split == 'train' else {}))

    cfg.train_dataloader = _loader(dataset('train', train_pipeline), settings, train=True)
    cfg.train_dataloader.batch_sampler = dict(type='AspectRatioBatchSampler')
    cfg.val_dataloader = _loader(dataset('val', test_pipeline), settings, train=False)
    cfg.test_dataloader = cfg.val_dataloader
    cfg.val_evaluator = dict(type='CocoMetric', ann_file=f'{root}/annotations/instances_val.json',
                             metric=['bbox', 'segm'] if with_mask else ['bbox'], format_only=False)
    cfg.test_evaluator = cfg.val_evaluator


def _segmentation_data(cfg: Config, settings: DemoSettings) -> None:
    from mmvisatt.datasets import DEMO_ADE_CLASSES, prepare_demo_ade

    root = prepare_demo_ade(img_size=settings.img_size, style=settings.style)
    heads = ('decode_head', 'auxiliary_head')
    if not set_num_classes(cfg.model, len(DEMO_ADE_CLASSES), heads):
        raise ValueError(f'--demo: no num_classes found under model.{{{",".join(heads)}}}')
    scale = (settings.img_size, settings.img_size)
    if cfg.model.get('data_preprocessor', {}).get('size') is not None:
        cfg.model.data_preprocessor.size = scale
    train_pipeline = [
        dict(type='LoadCheckedImageFromFile'),
        dict(type='LoadAnnotations'),
        dict(type='Resize', scale=scale, keep_ratio=True),
        dict(type='RandomFlip', prob=0.5),
        dict(type='PackSegInputs'),
    ]
    test_pipeline = [
        dict(type='LoadCheckedImageFromFile'),
        dict(type='Resize', scale=scale, keep_ratio=True),
        dict(type='LoadAnnotations'),
        dict(type='PackSegInputs'),
    ]

    # mmseg's ADE20KDataset insists on ADE20K's own class names, hence the generic dataset with ADE conventions.
    def dataset(folder: str, pipeline: list) -> dict:
        return dict(type='BaseSegDataset', data_root=root, img_suffix='.jpg', seg_map_suffix='.png',
                    reduce_zero_label=True, metainfo=dict(classes=DEMO_ADE_CLASSES), pipeline=pipeline,
                    data_prefix=dict(img_path=f'images/{folder}', seg_map_path=f'annotations/{folder}'))

    cfg.train_dataloader = _loader(dataset('training', train_pipeline), settings, train=True)
    cfg.val_dataloader = _loader(dataset('validation', test_pipeline), settings, train=False)
    cfg.test_dataloader = cfg.val_dataloader
    cfg.val_evaluator = dict(type='IoUMetric', iou_metrics=['mIoU'])
    cfg.test_evaluator = cfg.val_evaluator


def _classification_data(cfg: Config, settings: DemoSettings) -> None:
    from mmvisatt.datasets import DEMO_COCO_CLASSES, prepare_demo_imagenet

    root = prepare_demo_imagenet(img_size=settings.img_size, style=settings.style)
    if not set_num_classes(cfg.model, len(DEMO_COCO_CLASSES), ('head', )):
        raise ValueError('--demo: no num_classes found under model.head')
    if (cfg.get('data_preprocessor') or {}).get('num_classes') is not None:
        cfg.data_preprocessor.num_classes = len(DEMO_COCO_CLASSES)
    augments = (cfg.model.get('train_cfg') or {}).get('augments')
    if augments:
        # batch mixing of three shapes makes most targets a blend, which a run this short does not untangle
        print_log(f'demo: dropping the batch augments {", ".join(a["type"] for a in augments)}', logger='current')
        cfg.model.train_cfg.augments = None
    size = settings.img_size
    train_pipeline = [
        dict(type='LoadCheckedImageFromFile'),
        dict(type='Resize', scale=(size, size)),
        dict(type='RandomFlip', prob=0.5, direction='horizontal'),
        dict(type='PackInputs'),
    ]
    test_pipeline = [
        dict(type='LoadCheckedImageFromFile'),
        dict(type='ResizeEdge', scale=size, edge='short'),
        dict(type='PackInputs'),
    ]

    def dataset(split: str, pipeline: list) -> dict:
        return dict(type='CustomDataset', data_root=root, ann_file=f'meta/{split}.txt', data_prefix=split,
                    metainfo=dict(classes=DEMO_COCO_CLASSES), pipeline=pipeline)

    cfg.train_dataloader = _loader(dataset('train', train_pipeline), settings, train=True)
    cfg.val_dataloader = _loader(dataset('val', test_pipeline), settings, train=False)
    cfg.val_dataloader.batch_size = settings.batch_size
    cfg.test_dataloader = cfg.val_dataloader
    cfg.val_evaluator = dict(type='Accuracy', topk=(1, ))
    cfg.test_evaluator = cfg.val_evaluator


def describe_demo(cfg: Config, original_lr: Optional[float] = None) -> str:
    """One line on what a demo run will do and what it changed, read from the final config (after
    ``--cfg-options``); ``original_lr`` is the config's own."""
    loader, opt = cfg.train_dataloader, cfg.optim_wrapper.optimizer
    warmup = next((s.end for i, s in enumerate(cfg.param_scheduler) if _is_warmup(s, i)), 0)
    decays = [s.type for i, s in enumerate(cfg.param_scheduler) if not _is_warmup(s, i)]
    config_lr = f' (the config: {original_lr:g})' if original_lr not in (None, opt.lr) else ''
    changed = dict(mmdet='RoI counts, ', mmpretrain='batch augments, ').get(cfg.get('default_scope'), '')
    init = (cfg.model.get('backbone') or {}).get('init_cfg')
    start = f'from {init["checkpoint"]}' if isinstance(init, dict) and init.get('checkpoint') else 'random'
    return (f'demo: {cfg.train_cfg.max_iters} iterations of {loader.batch_size} generated images from '
            f'{loader.dataset.data_root}; {opt.type} with the config\'s parameter-wise rules, lr {opt.lr:g}'
            f'{config_lr} after {warmup} warmup iterations, then '
            + (f'{" + ".join(decays)} at the recipe\'s fraction of the run' if decays else 'constant') +
            f'; changed from the config: data, image size, schedule length and shape, lr, {changed}and the '
            f'backbone initialisation ({start})')


# default_scope -> how that library's configs are pointed at the demo data
DEMO_DATA: Dict[str, Callable[[Config, DemoSettings], None]] = {
    'mmdet': _detection_data,
    'mmseg': _segmentation_data,
    'mmpretrain': _classification_data,
}
DEMO_SETTINGS: Dict[str, DemoSettings] = {
    'mmdet': DemoSettings(),
    'mmseg': DemoSettings(),
    'mmpretrain': CLASSIFICATION_DEMO,
}


def disable_pretrained(model: ConfigDict) -> None:
    """Drop the backbone's ImageNet initialisation (nothing can be downloaded for the demo)."""
    backbone = model.get('backbone') or {}
    if backbone.get('init_cfg') is not None:
        print_log(f'demo: backbone initialisation {backbone.init_cfg} disabled (no checkpoint can be downloaded '
                  'here); the backbone starts from random weights', logger='current')
        backbone.init_cfg = None


def to_demo_config(cfg: Config, settings: Optional[DemoSettings] = None, train: bool = True,
                   keep_backbone_init: bool = False) -> Config:
    """Point ``cfg`` at the demo data (in place) and, for training, shorten its schedule; returns ``cfg``.

    ``settings``: default :data:`DEMO_SETTINGS` of the config's task library. ``keep_backbone_init``: the command
    line names the backbone's checkpoint (the demo's pre-training run), so its ``init_cfg`` stays. Data are
    generated on first use; every rank may call this (generation is rank-safe and idempotent).
    """
    scope = cfg.get('default_scope')
    if scope not in DEMO_DATA:
        raise ValueError(f'--demo supports configs with default_scope in {sorted(DEMO_DATA)}, got {scope!r}')
    settings = DEMO_SETTINGS[scope] if settings is None else settings
    DEMO_DATA[scope](cfg, settings)
    if not keep_backbone_init:
        disable_pretrained(cfg.model)
    if train:
        shorten_schedule(cfg, settings)
        config_lr = cfg.optim_wrapper.optimizer.get('lr')
        cfg.optim_wrapper.optimizer.lr = settings.lr
        if cfg.get('auto_scale_lr'):
            cfg.auto_scale_lr.enable = False
        cfg.randomness = dict(seed=settings.seed)
        # the hook describes the run from the final config (after --cfg-options), against the config's own lr
        cfg.custom_hooks = list(cfg.get('custom_hooks') or []) + [dict(type='EvalProgressHook'),
                                                                  dict(type='DemoReportHook', config_lr=config_lr)]
    return cfg


@HOOKS.register_module()
class DemoReportHook(Hook):
    """Before training, one line on what the demo run does (``config_lr``: the config's own lr, which the demo
    replaced); at the end of training, something to look at: the trained model's predictions beside the ground
    truth of the first ``num_images`` validation images, and the training curves, as PNG files in the work dir.

    ``<prefix>_predictions.png`` stacks one row per image, drawn by the config's visualizer: for a detector the
    ground truth on the left and the prediction on the right (boxes, masks, class names and scores above
    ``score_thr``), for a segmentor the two class maps, for a classifier the image with its true and predicted
    class. ``<prefix>_curves.png`` plots the losses and the validation metrics
    (:func:`mmvisatt.analysis.logs.plot_training_log`). Both paths are logged. Main process only.
    """

    priority = 'LOWEST'

    def __init__(self, num_images: int = 4, score_thr: float = 0.3, prefix: str = 'demo',
                 config_lr: Optional[float] = None) -> None:
        self.num_images = num_images
        self.score_thr = score_thr
        self.prefix = prefix
        self.config_lr = config_lr

    def before_train(self, runner) -> None:
        print_log(describe_demo(runner.cfg, self.config_lr), logger='current')

    def after_train(self, runner) -> None:
        if not is_main_process():
            return
        paths = [self._predictions(runner), self._curves(runner)]
        print_log('Demo pictures:\n  ' + '\n  '.join(p for p in paths if p), logger='current')

    def _predictions(self, runner) -> Optional[str]:
        import mmcv
        import numpy as np
        from mmengine.dataset import pseudo_collate
        if runner.val_loop is None:
            print_log('no validation data, so no predictions to draw', logger='current')
            return None
        dataset = runner.val_dataloader.dataset
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        visualizer = runner.visualizer
        visualizer.dataset_meta = dataset.metainfo
        rows = []
        was_training = model.training
        model.eval()
        # through files: mmseg's visualizer keeps only the prediction half as its current image
        with tempfile.TemporaryDirectory() as tmp:
            try:
                for index in range(min(self.num_images, len(dataset))):
                    with torch.no_grad():
                        sample = model.test_step(pseudo_collate([dataset[index]]))[0]
                    image = mmcv.imread(sample.img_path, channel_order='rgb')
                    out_file = osp.join(tmp, f'{index}.png')
                    if 'pred_label' in sample:
                        # mmpretrain's visualizer names its classification drawing apart; a small image is
                        # enlarged so that the label text fits
                        visualizer.visualize_cls(image, sample, classes=dataset.metainfo.get('classes'),
                                                 resize=224, show=False, out_file=out_file)
                    else:
                        kwargs = dict(pred_score_thr=self.score_thr) if 'pred_instances' in sample else {}
                        visualizer.add_datasample(osp.basename(sample.img_path), image, sample, draw_gt=True,
                                                  draw_pred=True, show=False, out_file=out_file, **kwargs)
                    rows.append(mmcv.imread(out_file))
            finally:
                model.train(was_training)
        if not rows:
            return None
        width = max(r.shape[1] for r in rows)
        rows = [np.pad(r, ((0, 0), (0, width - r.shape[1]), (0, 0)), constant_values=255) for r in rows]
        path = osp.join(runner.work_dir, f'{self.prefix}_predictions.png')
        if not mmcv.imwrite(np.concatenate(rows), path):
            raise OSError(f'could not write {path}')
        return path

    def _curves(self, runner) -> Optional[str]:
        from mmvisatt.analysis.logs import LogError, load_training_log, plot_training_log
        try:
            log = load_training_log(runner.work_dir)
        except (LogError, FileNotFoundError) as error:
            print_log(f'no training curves: {error}', logger='current')
            return None
        keys = [k for k in log.train if k == 'loss'] + [k for k in log.val
                                                        if k.endswith(('_mAP', 'mIoU', 'accuracy/top1'))]
        return plot_training_log(log, osp.join(runner.work_dir, f'{self.prefix}_curves.png'), keys=keys or None,
                                 title=osp.basename(osp.abspath(runner.work_dir)))
