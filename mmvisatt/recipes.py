"""The downstream training recipes: for every backbone preset and dense recipe (COCO detection, ADE20K
segmentation), the values its task config trains with and where each comes from.

This table is the single source of the dense task configs (``mmvisatt/task_configs.py`` renders them,
``tests/test_recipes.py`` checks the loaded configs against it, ``docs/recipes.md`` is written from it). An entry is
either *official* (the pair has an official downstream config: the values are that file's, with their
``repo@commit:path:line``) or *borrowed* (no official counterpart: the entry is an official recipe of another size
or family, named in ``source``, with ``why``). ``deviations`` lists, with the reason, every way our config differs
from the file it names. ImageNet recipes are not here: they stay in the presets' ``cls`` entries.

Every recipe is laid out for 8 GPUs (``train_dataloader.batch_size = total_batch / 8``) and says its total batch in
``auto_scale_lr.base_batch_size``, so ``--auto-scale-lr`` rescales the lr for any other GPU count.
"""
import dataclasses
from dataclasses import dataclass, field
from typing import Dict, Mapping, Optional, Sequence, Tuple, Union

GPUS = 8

# The official repositories at the commits read (re-read with the search tool's fetch).
RMT = 'qhfan/RMT@32ea214'
FAN = 'NVlabs/FAN@ee1b7df'
PVT = 'whai362/PVT@57e2dfa'
SWIN = 'SwinTransformer/Swin-Transformer-Object-Detection@c7b2011'
D2 = 'facebookresearch/detectron2@87b1bf9'
MMSEG_SWIN = 'open-mmlab/mmsegmentation@v1.2.2'
REVIT_PAPER = 'the ReViT paper (arXiv 2402.11301), experiments section'

SYNC_BN = {'type': 'SyncBN'}
# The no-decay keys of the Swin detection configs, which RMT, FAN and PVTv2 copied verbatim (the first two match
# no parameter of RMT, FAN or Shunted).
SWIN_KEYS = ('absolute_pos_embed', 'relative_position_bias_table', 'norm')


@dataclass(frozen=True)
class Schedule:
    """The schedule of a recipe kind (the ``configs/_base_/schedules`` file its configs inherit)."""
    max_epochs: int = 0  # epoch-based (detection), else
    max_iters: int = 0  # iteration-based (segmentation)
    milestones: Tuple[int, ...] = ()  # MultiStepLR, x0.1 each
    power: float = 0.  # PolyLR


SCHEDULES: Dict[str, Schedule] = {
    'mask_rcnn_1x': Schedule(max_epochs=12, milestones=(8, 11)),
    'retinanet_1x': Schedule(max_epochs=12, milestones=(8, 11)),
    'mask_rcnn_3x': Schedule(max_epochs=36, milestones=(27, 33)),
    'cascade_mask_rcnn_3x': Schedule(max_epochs=36, milestones=(27, 33)),
    'upernet_160k_ade20k': Schedule(max_iters=160000, power=1.0),
    'fpn_80k_ade20k': Schedule(max_iters=80000, power=0.9),
    'segformer_160k_cityscapes': Schedule(max_iters=160000, power=1.0),
}
DENSE_RECIPES = tuple(SCHEDULES)
# the recipes every backbone has; the others belong to the families that published them (FAN-Hybrid's SegFormer)
COMMON_RECIPES = DENSE_RECIPES[:6]


@dataclass(frozen=True)
class TrainRecipe:
    """What one dense task config trains with.

    ``lines`` maps a field (``optimizer``, ``paramwise``, ``drop_path``, ``schedule``, ``warmup``, ``batch``,
    ``amp``, ``backbone``, ``checkpoint``) to where the official file says it (``:23``, or another file).
    """
    label: str  # e.g. 'RMT-T Mask R-CNN 1x'
    source: str  # repo@commit:path of the official file (official), or of the recipe borrowed
    official: bool
    optimizer: Mapping[str, object]
    drop_path_rate: float
    no_decay: Tuple[str, ...] = ()  # custom_keys with decay_mult 0
    norm_decay_mult: Optional[float] = None
    lr_mult: Mapping[str, float] = field(default_factory=dict)  # custom_keys with lr_mult
    warmup_iters: int = 500
    warmup_ratio: float = 1e-3
    min_lr: float = 0.  # PolyLR eta_min
    total_batch: int = 16
    official_layout: str = '2 images x 8 GPUs'
    amp: Union[None, str, float] = None  # None: float32; 'dynamic' or a static loss scale
    backbone: Mapping[str, object] = field(default_factory=dict)  # backbone settings of the recipe
    checkpoint_key: Optional[str] = None  # entry of the release file loaded (None: the backbone's default)
    lines: Mapping[str, str] = field(default_factory=dict)
    deviations: Tuple[str, ...] = ()
    why: str = ''  # borrowed: why this recipe
    reported: str = ''  # the published result this config reproduces, if any
    memory: str = ''  # what the config turns on to fit one 80 GB GPU at its per-GPU batch, and why
    gpus: int = GPUS  # the GPUs the total batch is spread over

    @property
    def images_per_gpu(self) -> int:
        return self.total_batch // self.gpus

    def describe(self) -> str:
        """One phrase for a config header."""
        amp = ('float32' if self.amp is None else 'fp16 AMP (dynamic loss scale)' if self.amp == 'dynamic' else
               f'fp16 AMP (static loss scale {self.amp:g})')
        opt = self.optimizer
        kind = 'official' if self.official else 'borrowed from'
        return (f'{kind} {self.label} ({self.source}); {opt["type"]} {opt["lr"]:g}, wd {opt["weight_decay"]:g}, '
                f'total batch {self.total_batch} = {self.gpus} GPUs x {self.images_per_gpu}, {amp}')


def borrow(recipe: TrainRecipe, why: str, **changes) -> TrainRecipe:
    """``recipe`` for a pair without an official counterpart: the same values (but ``changes``), its source kept
    and named as borrowed, no reported result."""
    return dataclasses.replace(recipe, official=False, why=why, reported='', **changes)


# The ReViT families' residual gate is a scalar mixing weight: decay would pull it to 0 (residual scores only).
_GATE = 'the residual gate alpha is trained without weight decay'


# Deviations several official recipes share.
_APEX = 'apex O1 mixed precision (dynamic loss scale) becomes torch AMP with a dynamic scale'
_RETINANET = ('RetinaNet head: the focal-loss normaliser is averaged over GPUs (SyncAvgRetinaHead); mmdet 2.x used '
              'each GPU\'s own positives. Same on one GPU; steadier with 2 images per GPU',
              'backbone outputs (1, 2, 3) with FPN start_level 0 instead of (0, 1, 2, 3) with start_level 1: the same '
              'levels, without the unused stride-4 output norm that would stop DDP')


def _adamw(lr: float, weight_decay: float, betas: bool = True) -> Dict[str, object]:
    opt: Dict[str, object] = dict(type='AdamW', lr=lr, weight_decay=weight_decay)
    if betas:
        opt['betas'] = (0.9, 0.999)
    return opt


# ---------------------------------------------------------------------------------------------------------------
# RMT (official det/seg configs for T/S/B/L; the file names use m for B) and EVT (no recipes: RMT's of its size)

_RMT_DP = {'t': 0.1, 's': 0.15, 'b': 0.4, 'l': 0.5}
# the EVT paper's stochastic depth (section 4.1; the RMT configs use their ImageNet values downstream too)
_EVT_DP = {'t': 0.1, 's': 0.15, 'b': 0.4, 'l': 0.55}
_RMT_FILE = {'t': 't', 's': 's', 'b': 'm', 'l': 'l'}
_RMT_BACKBONE = dict(norm_cfg=SYNC_BN)
_RMT_COMMON = ('the stem and downsampling BatchNorms are nn.SyncBatchNorm in training mode '
               '(detect/mmdet/models/backbones/RMT.py:363, 471-480; norm_eval only stops nn.BatchNorm2d, :609)')
_RMT_CKPT = ('the official loader takes state_dict, else model (detect/mmcv_custom/checkpoint.py:312-320); the file '
             'the official runs loaded (downtarget.pth) was not published')


def _rmt_det(size: str, recipe: str) -> Optional[TrainRecipe]:
    f = _RMT_FILE[size]
    dp = _RMT_DP[size]
    common = dict(drop_path_rate=dp, backbone=_RMT_BACKBONE, checkpoint_key='model')
    if recipe == 'mask_rcnn_1x':
        off = 0 if size in 'ts' else 1
        return TrainRecipe(
            f'RMT-{size.upper()} Mask R-CNN 1x', f'{RMT}:detect/configs/RMT/maskrcnn_{f}_1x.py', True,
            _adamw(2e-4 if size == 'l' else 4e-4, 0.05), no_decay=SWIN_KEYS, amp='dynamic', **common,
            lines=dict(optimizer=f':{23 + off}', paramwise=f':{24 + off}-{26 + off}', drop_path=':15',
                       schedule=f':{27 + off} step [8, 11]; 12 epochs (_base_/schedules/schedule_1x.py:11)',
                       warmup='_base_/schedules/schedule_1x.py:5-10',
                       batch=f':{52 + off} (samples_per_gpu=2; 8 GPUs)',
                       amp=f':{41 + off} fp16=dict() over _base_/default_runtime.py:17 loss_scale=dynamic',
                       backbone=_RMT_COMMON, checkpoint=_RMT_CKPT))
    if recipe == 'mask_rcnn_3x' and size != 't':
        lines = {'s': (':71', ':67', ':78'), 'b': (':72', ':68', ':79'), 'l': (':72', ':68', ':79')}[size]
        return TrainRecipe(
            f'RMT-{size.upper()} Mask R-CNN 3x', f'{RMT}:detect/configs/RMT/maskrcnn_{f}_3x.py', True,
            _adamw(4e-4 if size == 's' else 2e-4, 0.05), no_decay=SWIN_KEYS, amp='dynamic',
            total_batch=8 if size == 'l' else 16,
            official_layout='1 image x 8 GPUs' if size == 'l' else '2 images x 8 GPUs', **common,
            lines=dict(optimizer=lines[0], paramwise=lines[0], drop_path=':15',
                       schedule='step [27, 33], runner max_epochs 36 (end of file)', warmup=lines[2],
                       batch=f'{lines[1]} (samples_per_gpu={1 if size == "l" else 2}; 8 GPUs)',
                       amp='fp16=dict() over _base_/default_runtime.py:17 loss_scale=dynamic',
                       backbone=_RMT_COMMON, checkpoint=_RMT_CKPT))
    if recipe == 'cascade_mask_rcnn_3x' and size in 'sb':
        opt_line = ':73-81' if size == 's' else ':74-82'
        return TrainRecipe(
            f'RMT-{size.upper()} Cascade Mask R-CNN 3x', f'{RMT}:detect/configs/RMT/casrcnn_{f}_3x.py', True,
            _adamw(4e-4 if size == 's' else 2e-4, 0.05), no_decay=SWIN_KEYS + ('rpe_table', ), norm_decay_mult=0.,
            amp='dynamic', **common,
            lines=dict(optimizer=opt_line, paramwise=opt_line, drop_path=':16', schedule='step [27, 33], 36 epochs',
                       warmup=':86' if size == 's' else ':87',
                       batch=f':{69 if size == "s" else 70} (samples_per_gpu=2; 8 GPUs)',
                       amp='fp16 = dict() (dynamic, _base_/default_runtime.py:17)', backbone=_RMT_COMMON,
                       checkpoint=_RMT_CKPT))
    if recipe == 'retinanet_1x':
        off = 0 if size in 'ts' else 1
        return TrainRecipe(
            f'RMT-{size.upper()} RetinaNet 1x', f'{RMT}:detect/configs/RMT/retinanet_{f}_1x.py', True,
            _adamw(2e-4 if size == 'l' else 4e-4, 1e-4, betas=False), amp=512., **common,
            lines=dict(optimizer=f':{30 + off} (no paramwise_cfg: every parameter decayed)', drop_path=':15',
                       schedule=f'runner max_epochs 12 (:{33 + off}), step [8, 11] (_base_/schedules/schedule_1x.py)',
                       warmup='_base_/schedules/schedule_1x.py:5-10',
                       batch=f':{45 + off} (samples_per_gpu=2; 8 GPUs)',
                       amp=f':{34 + off} fp16=dict(loss_scale=512.0)', backbone=_RMT_COMMON, checkpoint=_RMT_CKPT),
            deviations=_RETINANET)
    return None


def _rmt_seg(size: str, recipe: str) -> Optional[TrainRecipe]:
    f = _RMT_FILE[size]
    common = dict(drop_path_rate=_RMT_DP[size], backbone=_RMT_BACKBONE, checkpoint_key='model')
    if recipe == 'fpn_80k_ade20k':
        opt_line = ':29' if size in 'bl' else ':28'
        return TrainRecipe(
            f'RMT-{size.upper()} Semantic FPN 80k', f'{RMT}:segmentation/configs/RMT/RMT_FPN_{f}_1x.py', True,
            _adamw(1e-4, 1e-4, betas=False), warmup_iters=0, min_lr=1e-6, **common,
            lines=dict(optimizer=f'{opt_line} (no paramwise_cfg: every parameter decayed)', drop_path=':14',
                       schedule='runner max_iters 80000; poly power 0.9, min_lr 1e-6 '
                                '(segmentation/configs/_base_/schedules/schedule_80k.py:5), no warmup',
                       batch='samples_per_gpu=2 x 8 GPUs (segmentation/train_fpn_*_1x.sh:13)', amp='none (fp32)',
                       backbone=_RMT_COMMON, checkpoint=_RMT_CKPT))
    if recipe == 'upernet_160k_ade20k' and size != 't':
        off = 0 if size == 's' else 1
        return TrainRecipe(
            f'RMT-{size.upper()} UperNet 160k', f'{RMT}:segmentation/configs/RMT/RMT_Uper_{f}_2x.py', True,
            _adamw(6e-5, 0.01), no_decay=SWIN_KEYS, warmup_iters=1500, warmup_ratio=1e-6, amp=512., **common,
            lines=dict(optimizer=f':{40 + off}-{43 + off}', paramwise=f':{41 + off}-{43 + off}', drop_path=':20',
                       schedule=f':{44 + off}-{48 + off} poly power 1.0, min_lr 0; max_iters 160000',
                       warmup=f':{46 + off}-{47 + off} 1500 iterations at 1e-6',
                       batch=f':{51 + off} (samples_per_gpu=2) x 8 GPUs (segmentation/train_uper_*_2x.sh:13)',
                       amp=':72 Fp16OptimizerHook(loss_scale=512.)', backbone=_RMT_COMMON,
                       checkpoint=_RMT_CKPT),
            deviations=(() if size == 'l' else (
                'as shipped the file raises ZeroDivisionError (gpu_multipliers=1, integer-divided by 2 or used as '
                'a divisor of 1500//(...)//2); the values are those RMT_Uper_l_2x.py states and this file evidently '
                'intends', )))
    return None


def rmt_recipes(token: str, size: str) -> Dict[str, TrainRecipe]:
    out: Dict[str, TrainRecipe] = {}
    for recipe in COMMON_RECIPES:
        entry = _rmt_det(size, recipe) or _rmt_seg(size, recipe)
        if entry is None:  # no official file for this size: the nearest size's recipe, with this size's drop path
            donor = {'t': 's', 'l': 'b'}[size] if recipe != 'mask_rcnn_3x' else 's'
            entry = borrow(_rmt_det(donor, recipe) or _rmt_seg(donor, recipe),
                           f'RMT published no {recipe} config for RMT-{size.upper()}; the RMT-{donor.upper()} one',
                           drop_path_rate=_RMT_DP[size])
        out[recipe] = entry
    if token.startswith('evt'):
        out = {k: borrow(v, 'EVT published no downstream recipes (its paper names MMDetection, AdamW, 1x and 3x + MS, '
                            'and Swin / PVT\'s ADE20K schedules); those of RMT of the same size, the network EVT '
                            'extends (conv stem, CPE, decayed attention), with EVT\'s drop path',
                         checkpoint_key=None, drop_path_rate=_EVT_DP[size])
               for k, v in out.items()}
    return out


# ---------------------------------------------------------------------------------------------------------------
# FAN (official: the hybrid Cascade Mask R-CNN 3x for T/S/B/L; every other pair borrows it or the mmseg recipes)

_FAN_FILE = {'t': 'tiny', 's': 'small', 'b': 'base', 'l': 'large'}
_FAN_LINES = {'t': (':134-137', ':131', '', ':14-19'), 's': (':132-135', ':129', ':142-151', ':14'),
              'b': (':133-136', ':130', ':143-151', ':15'), 'l': (':138-141', ':135', ':148-156', ':14')}
# the detection backbone (detection/models/fan.py): no output norms, the unfloored Fourier exponent
_FAN_DET_BACKBONE = dict(norm_cfg=SYNC_BN, out_norms=False, pos_exponent='linear')
_FAN_BACKBONE_LINE = ('detection/models/fan.py: nn.SyncBatchNorm in conv3x3 / DWConv (:116, :247); outputs without '
                      'norms (:540-546, 604-615); torch.div(dim_t, 2) without floor (:68); uniform drop path 0.3 '
                      '(:681-716)')


def _fan_l_init(where: str, more: str = '') -> str:
    return (f'initialised from fan_hybrid_large_in22k_1k.pth.tar: the IN-1k FAN-L-Hybrid weights the file loads '
            f'({where}) were never released{more}')


def _fan_cascade(size: str) -> TrainRecipe:
    opt_line, batch_line, amp_line, init_line = _FAN_LINES[size]
    deviations = ['total batch 32 as 8 GPUs x 4 images (official: 1 image x 32 GPUs, detection/README.md:35)',
                  _APEX,
                  'use_checkpoint=True (:682) is not set: activation checkpointing changes memory, not results; '
                  'set model.backbone.with_cp=True if memory is short']
    if size == 't':
        deviations += ['the tiny file as shipped trains 12 epochs (its runner lines are commented out, :141-153), '
                       'from scratch (pretrained=None, :19) and in fp32; ours follows the 3x recipe its name and the '
                       'S/B/L files give, from the released FAN-T-Hybrid ImageNet weights, with their AMP']
    if size == 'l':
        deviations += [_fan_l_init('fan_large_12_p4_hybrid.pth.tar, :14',
                                   '; this is the init of the official _22k config '
                                   '(cascade_mask_fan_large_fpn_3x_mstrain_fp16_22k.py:14)')]
    return TrainRecipe(
        f'FAN-{size.upper()}-Hybrid Cascade Mask R-CNN 3x',
        f'{FAN}:detection/configs/cascade_mask_fan_{_FAN_FILE[size]}_fpn_3x_mstrain_fp16.py', True,
        _adamw(1e-4, 0.05), drop_path_rate=0.3, no_decay=SWIN_KEYS, total_batch=32,
        official_layout='1 image x 32 GPUs', amp='dynamic', backbone=_FAN_DET_BACKBONE,
        lines=dict(optimizer=opt_line, paramwise=opt_line, drop_path=_FAN_BACKBONE_LINE,
                   schedule='step [27, 33], EpochBasedRunnerAmp max_epochs 36',
                   warmup='detection/configs/_base_/schedules/schedule_1x.py:5-10',
                   batch=f'{batch_line} samples_per_gpu=1; 32 GPUs (detection/README.md:35)',
                   amp=f'{amp_line} apex O1 (detection/mmdet_custom/apis/train.py:95-99)' if amp_line else
                   'none in the tiny file as shipped', backbone=_FAN_BACKBONE_LINE,
                   checkpoint=f'{init_line} model.pretrained'),
        deviations=tuple(deviations),
        reported='' if size == 'l' else 'the FAN README\'s COCO detector row (Cascade Mask R-CNN 3x, IN-1K pretrained)')


def fan_recipes(token: str, form: str, size: str) -> Dict[str, TrainRecipe]:
    cascade = _fan_cascade(size)
    backbone = _FAN_DET_BACKBONE if form == 'hybrid' else dict(norm_cfg=SYNC_BN)
    out: Dict[str, TrainRecipe] = {}
    for recipe in ('mask_rcnn_1x', 'mask_rcnn_3x', 'cascade_mask_rcnn_3x', 'retinanet_1x'):
        if form == 'hybrid' and recipe == 'cascade_mask_rcnn_3x':
            out[recipe] = cascade
        else:
            out[recipe] = borrow(cascade, 'FAN published COCO recipes for the hybrid Cascade Mask R-CNN 3x only; '
                                          'its optimizer, batch and AMP', backbone=backbone,
                                 deviations=tuple(d for d in cascade.deviations if 'tiny file' not in d))
    out['upernet_160k_ade20k'] = borrow(
        SWIN_UPERNET, 'FAN published segmentation for Cityscapes only (SegFormer head); the Swin UperNet recipe, '
                      'with the FAN segmentation drop path 0 (segmentation/mmseg/models/backbones/fan.py:642-680)',
        drop_path_rate=0., backbone=backbone)
    out['fpn_80k_ade20k'] = borrow(PVT_FPN, 'FAN published no Semantic FPN recipe; PVT\'s', drop_path_rate=0.1,
                                   backbone=backbone)
    if form == 'hybrid':
        out['segformer_160k_cityscapes'] = _fan_segformer(size)
    return out


_FAN_SEG_LINES = {'t': (':44-48', ':40', ':19 (commented out: no init)'), 's': (':44-48', ':40', ':19'),
                  'b': (':44-48', ':40', ':19'), 'l': (':45-49', ':41', ':20')}


def _fan_segformer(size: str) -> TrainRecipe:
    opt_line, batch_line, init_line = _FAN_SEG_LINES[size]
    deviations = [
        'mmseg 1.x\'s SegformerHead (a 1x1 ConvModule with SyncBN and ReLU per level, as mmseg reproduces SegFormer) '
        'instead of the original SegFormer head\'s per-level linear layers; the embedding width 768 is the official '
        'decoder_params embed_dim',
        'RepeatDataset(times=500) of the official data base is dropped: with an infinite sampler over 160k '
        'iterations it changes only how often the loader restarts',
        'evaluation every 16k iterations instead of 4k (no effect on training)']
    if size == 't':
        deviations += ['the tiny script launches 1 GPU (scripts/fan_tiny_hybrid_city.sh: total batch 1) and the file '
                       'loads no weights; ours follows the S/B/L scripts (8 GPUs x 1) from the released FAN-T-Hybrid '
                       'ImageNet weights']
    if size == 'l':
        deviations += [_fan_l_init('fan_large_16_p4_hybrid.pth.tar, :20')]
    return TrainRecipe(
        f'FAN-{size.upper()}-Hybrid SegFormer 160k Cityscapes',
        f'{FAN}:segmentation/local_configs/fan/fan_hybrid/fan_hybrid_{_FAN_FILE[size]}.1024x1024.city.160k.py', True,
        _adamw(6e-5, 0.01), drop_path_rate=0., no_decay=('pos_block', 'norm'), lr_mult={'head': 10.},
        warmup_iters=1500, warmup_ratio=1e-6, total_batch=8, official_layout='1 image x 8 GPUs',
        backbone=dict(norm_cfg=SYNC_BN, out_norms=False, pos_exponent='linear', feat_downsample=False),
        lines=dict(optimizer=opt_line, paramwise=f'{opt_line} pos_block, norm decay_mult 0; head lr_mult 10',
                   drop_path='segmentation/mmseg/models/backbones/fan.py:642-680 (drop_path_rate=0.)',
                   schedule='poly power 1.0, min_lr 0 (:50-54); 160k iterations (_base_/schedules/'
                            'schedule_160k_8gpu_adamw.py:7)', warmup=':50-54 1500 iterations at 1e-6',
                   batch=f'{batch_line} samples_per_gpu=1 x 8 GPUs (segmentation/scripts/'
                         f'fan_{_FAN_FILE[size]}_hybrid_city.sh)',
                   amp='none (the fp16 lines at the end of the file are commented out)',
                   backbone='segmentation/mmseg/models/backbones/fan.py: feat_downsample=False (the fourth level is '
                            'the class-attention patch tokens at stride 16, :577-581), SyncBatchNorm (:84, :215), '
                            'torch.div(dim_t, 2) without floor (:70), no output norms',
                   checkpoint=f'{init_line} model.pretrained',
                   data='_base_/datasets/cityscapes_1024x1024_repeat.py: resize 2048x1024 x0.5-2.0, 1024 crop '
                        '(cat_max 0.75), flip, photometric; test 2048x1024, slide 1024 / stride 768 (:37)'),
        deviations=tuple(deviations))


# ---------------------------------------------------------------------------------------------------------------
# Swin-shaped (ReSwin-T/S/B, EVT-Swin-T/S/B): the official Swin detection recipes and mmseg's Swin UperNet

def _swin_det(name: str, recipe: str, drop_path: float) -> TrainRecipe:
    three = recipe.endswith('3x')
    cascade = recipe.startswith('cascade')
    file = ('cascade_mask_rcnn_swin_tiny_patch4_window7_mstrain_480-800_giou_4conv1f_adamw_3x_coco.py' if cascade else
            f'mask_rcnn_swin_tiny_patch4_window7_mstrain_480-800_adamw_{"3x" if three else "1x"}_coco.py')
    return TrainRecipe(
        f'Swin-T {"Cascade Mask R-CNN" if cascade else "Mask R-CNN"} {"3x" if three else "1x"} ({name})',
        f'{SWIN}:configs/swin/{file}', True, _adamw(1e-4, 0.05), drop_path_rate=drop_path, no_decay=SWIN_KEYS,
        amp='dynamic',
        lines=dict(optimizer=':124-127' if cascade else ':64-67', paramwise=':124-127' if cascade else ':64-67',
                   drop_path=':14', schedule=':128-129' if cascade else ':68-69',
                   warmup='configs/_base_/schedules/schedule_1x.py:5-10',
                   batch='configs/_base_/datasets/coco_instance.py:31 (samples_per_gpu=2; 8 GPUs)',
                   amp=(':129-140' if cascade else ':69-80') + ' EpochBasedRunnerAmp + apex (use_fp16=True)'),
        deviations=(_APEX, ))


SWIN_UPERNET = TrainRecipe(
    'Swin-T UperNet 160k', f'{MMSEG_SWIN}:configs/swin/swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-'
    '512x512.py', True, _adamw(6e-5, 0.01), drop_path_rate=0.3, no_decay=SWIN_KEYS, warmup_iters=1500,
    warmup_ratio=1e-6,
    lines=dict(optimizer=':24-28 AdamW 6e-5, betas (0.9, 0.999), wd 0.01',
               paramwise=':29-34 absolute_pos_embed, relative_position_bias_table, norm: decay_mult 0',
               warmup=':37-38 LinearLR 1500 iterations at 1e-6', schedule=':39-46 PolyLR power 1.0 to 0 over 160k',
               batch=':49-50 8 GPUs x 2 images', amp='none (OptimWrapper, :26)', drop_path=':17'))

PVT_FPN = TrainRecipe(
    'PVT Semantic FPN', f'{PVT}:segmentation/configs/sem_fpn/PVT/fpn_pvt_s_ade20k_40k.py', True,
    _adamw(1e-4, 1e-4, betas=False), drop_path_rate=0.1, warmup_iters=0,
    lines=dict(optimizer=':18-20 AdamW 0.0001*gpu_multiples = 2e-4, wd 1e-4, no paramwise_cfg',
               schedule=':23-25 poly power 0.9, min_lr 0, 80000//gpu_multiples = 40k iterations',
               batch='_base_/datasets/ade20k.py:35 samples_per_gpu=4 x 8 GPUs (:18)', amp='none'),
    deviations=('80k iterations at 16 images and lr 1e-4 instead of 40k at 32 and 2e-4: the same images seen, the lr '
                'scaled linearly with the batch, the conversion the file\'s own comment makes from mmseg\'s '
                '4-GPU schedule (:18)', ))


# the drop path of the Swin-shaped backbones' dense recipes, per Swin size (ReSwin and EVT-Swin alike)
_SWIN_DP = {'t': dict(det=0.2, seg=0.3), 's': dict(det=0.3, seg=0.3), 'b': dict(det=0.3, seg=0.3)}


def swin_recipes(token: str, name: str, drop_path: Mapping[str, float], backbone: Mapping[str, object],
                 official: Sequence[str] = (), reported: Optional[Mapping[str, str]] = None,
                 extra_no_decay: Tuple[str, ...] = ()) -> Dict[str, TrainRecipe]:
    """``official``: the recipes whose Swin-T recipe is the one the family's paper trained (ReSwin-T Cascade)."""
    out: Dict[str, TrainRecipe] = {}
    for recipe in ('mask_rcnn_1x', 'mask_rcnn_3x', 'cascade_mask_rcnn_3x', 'retinanet_1x'):
        donor = _swin_det(name, 'mask_rcnn_1x' if recipe == 'retinanet_1x' else recipe, drop_path['det'])
        donor = dataclasses.replace(donor, backbone=backbone, no_decay=donor.no_decay + extra_no_decay,
                                    deviations=donor.deviations + ((_GATE, ) if extra_no_decay else ()))
        if recipe in official:
            out[recipe] = dataclasses.replace(donor, reported=(reported or {}).get(recipe, ''))
        else:
            out[recipe] = borrow(donor, f'no {name} {recipe} config was published; the official Swin-T detection '
                                        f'recipe of that schedule')
    out['upernet_160k_ade20k'] = borrow(SWIN_UPERNET, f'no {name} UperNet config was published; the Swin UperNet '
                                                      f'recipe', drop_path_rate=drop_path['seg'], backbone=backbone,
                                        no_decay=SWIN_UPERNET.no_decay + extra_no_decay,
                                        deviations=(_GATE, ) if extra_no_decay else ())
    out['fpn_80k_ade20k'] = borrow(PVT_FPN, f'no {name} Semantic FPN config was published; PVT\'s',
                                   drop_path_rate=drop_path['seg'], backbone=backbone, no_decay=extra_no_decay,
                                   deviations=PVT_FPN.deviations + ((_GATE, ) if extra_no_decay else ()))
    return out


# ---------------------------------------------------------------------------------------------------------------
# ReMViTv2 (the paper's ReMViTv2-T Mask R-CNN 3x = the Detectron2 MViTv2-T recipe) and ReViT-B (ViTDet's ViT-B)

_D2_FILE = f'{D2}:projects/MViTv2/configs/mask_rcnn_mvitv2_t_3x.py'


def _remvit_det(drop_path: float, name: str) -> TrainRecipe:
    return TrainRecipe(
        f'ReMViTv2-T Mask R-CNN 3x ({name})', _D2_FILE, True, _adamw(1.6e-4, 0.1), drop_path_rate=drop_path,
        no_decay=('pos_embed', 'rel_pos_h', 'rel_pos_w', 'norm'), warmup_iters=250, total_batch=64,
        official_layout='total_batch_size 64', amp='dynamic',
        lines=dict(optimizer=f':50-56 (lr 1.6e-4); common/optim.py AdamW betas (0.9, 0.999), wd 0.1; {REVIT_PAPER}: '
                             'lr 1.6e-4, wd 0.1, batch 64',
                   paramwise=':51-55 pos_embed, rel_pos_h, rel_pos_w wd 0; common/optim.py weight_decay_norm=0',
                   drop_path=':24', schedule=':39-47 67,500 iterations, steps at 52,500 / 62,500',
                   warmup=':46-47 250 iterations at 0.001', batch=':36 total_batch_size = 64',
                   amp=':32 train.amp.enabled = True (torch AMP, dynamic GradScaler)'),
        deviations=('36 epochs with steps after epochs 27 and 33 instead of 67,500 iterations with steps at 52,500 / '
                    '62,500 (36.6 / 28.5 / 33.9 epochs of COCO train2017 at batch 64)', _GATE))


def remvit_recipes(token: str, size: str) -> Dict[str, TrainRecipe]:
    dp = {'t': 0.2, 's': 0.2, 'b': 0.4}[size]
    donor = _remvit_det(dp, f'ReMViTv2-{size.upper()}')
    donor = dataclasses.replace(donor, no_decay=donor.no_decay + ('alpha', ))
    out: Dict[str, TrainRecipe] = {}
    for recipe in ('mask_rcnn_1x', 'mask_rcnn_3x', 'cascade_mask_rcnn_3x', 'retinanet_1x'):
        if token == 'remvit_t' and recipe == 'mask_rcnn_3x':
            out[recipe] = dataclasses.replace(
                donor, reported='the ReViT paper\'s ReMViTv2-T detector (Mask R-CNN 3x, COCO)')
        else:
            out[recipe] = borrow(donor, 'the paper trained only the ReMViTv2-T Mask R-CNN 3x; its recipe (the '
                                        'Detectron2 MViTv2 one)')
    out['upernet_160k_ade20k'] = borrow(SWIN_UPERNET, 'no ReMViTv2 / MViTv2 UperNet recipe was published; the Swin '
                                                      'UperNet recipe', drop_path_rate=0.3,
                                        no_decay=('norm', 'rel_pos_h', 'rel_pos_w', 'alpha'))
    out['fpn_80k_ade20k'] = borrow(PVT_FPN, 'no ReMViTv2 Semantic FPN recipe was published; PVT\'s',
                                   drop_path_rate=0.3, no_decay=('alpha', ), deviations=PVT_FPN.deviations + (_GATE, ))
    return out


VITDET_B = TrainRecipe(
    'ViTDet ViT-B Mask R-CNN', 'facebookresearch/detectron2@1d650ef:projects/ViTDet/configs/COCO/'
    'mask_rcnn_vitdet_b_100ep.py', True, _adamw(1e-4, 0.1), drop_path_rate=0.1, no_decay=('norm', 'pos_embed', 'alpha'),
    warmup_iters=250, total_batch=64, official_layout='total_batch_size 64 (common/coco_loader_lsj.py)', amp='dynamic',
    lines=dict(optimizer=':37-39 common/optim.py AdamW (lr 1e-4, betas (0.9, 0.999), wd 0.1)',
               paramwise=':39 pos_embed wd 0; common/optim.py weight_decay_norm=0', warmup=':26-33 250 iterations',
               batch='common/coco_loader_lsj.py total_batch_size 64', amp=':15 train.amp.enabled = True',
               drop_path='common/models/mask_rcnn_vitdet.py drop_path_rate 0.1'),
    deviations=('no layer-wise lr decay (0.7, :38)', 'the ViTDet schedule (100 epochs, large-scale jitter) is '
                'replaced by the recipe\'s own 1x / 3x schedule and data pipeline', _GATE))


def fit_80gb(recipe: TrainRecipe, with_cp: bool = True, **settings) -> TrainRecipe:
    """``recipe`` with the backbone settings that fit its training step at the recipe's images per GPU into an 80 GB
    GPU: activation checkpointing (``with_cp``) and ``settings`` (a score-memory strategy of the ReViT family). The
    step is over 80 GB without them (docs/benchmarks.md, Memory per GPU, has both figures)."""
    turned_on = dict(with_cp=True, **settings) if with_cp else dict(settings)
    named = ', '.join(f'{k}={v!r}' for k, v in turned_on.items())
    return dataclasses.replace(
        recipe, backbone=dict(recipe.backbone, **turned_on),
        memory=f'{named}: at {recipe.images_per_gpu} images per GPU the training step is over 80 GB without '
               f'{"them" if len(turned_on) > 1 else "it"} (docs/benchmarks.md, Memory per GPU); the total batch '
               f'stays {recipe.total_batch}')


def spread(recipe: TrainRecipe, gpus: int) -> TrainRecipe:
    """``recipe`` with its total batch spread over ``gpus`` GPUs: its training step at the images per GPU of
    :data:`GPUS` GPUs is over 80 GB even with what ``recipe.memory`` turns on (docs/benchmarks.md, Memory per
    GPU)."""
    spread_out = dataclasses.replace(recipe, gpus=gpus)
    kept = recipe.memory.split(':')[0] if recipe.memory else ''  # what the recipe already turns on
    return dataclasses.replace(
        spread_out, memory=f'{kept + " and " if kept else ""}{gpus} GPUs x {spread_out.images_per_gpu}: at '
                           f'{recipe.images_per_gpu} images per GPU the training step at this recipe\'s largest '
                           f'padded batch (1250x1333) is over 80 GB{" with " + kept if kept else ""} '
                           f'(docs/benchmarks.md, Memory per GPU); the total batch stays {recipe.total_batch}')


#: what a detection recipe turns on to fit its step into an 80 GB GPU at the recipe's images per GPU, by backbone and
#: recipe, as the measured rows decide (docs/benchmarks.md, Memory per GPU): each config is over 80 GB without it
_FIT_80GB = {
    **{('remvit_t', r): dict(score_memory='handoff') for r in ('mask_rcnn_3x', 'cascade_mask_rcnn_3x')},
    **{('remvit_s', r): dict(with_cp=True, score_memory='handoff') for r in ('mask_rcnn_3x', 'cascade_mask_rcnn_3x')},
    **{('remvit_b', r): dict(with_cp=True, score_memory='handoff')
       for r in ('mask_rcnn_1x', 'mask_rcnn_3x', 'cascade_mask_rcnn_3x', 'retinanet_1x')},
    **{('revit_b', r): dict(with_cp=True, score_memory='factors') for r in ('mask_rcnn_3x', 'cascade_mask_rcnn_3x')},
    **{('fan_swin_l', r): dict(with_cp=True) for r in ('mask_rcnn_3x', 'cascade_mask_rcnn_3x')},
}
#: the recipes whose batch is spread over more GPUs than the recipe's, and over how many: at the recipe's images per
#: GPU they are over 80 GB even with what :data:`_FIT_80GB` turns on
_SPREAD = {('remvit_b', 'mask_rcnn_3x'): 16, ('remvit_b', 'cascade_mask_rcnn_3x'): 16}


def _fit_80gb(token: str, recipes: Dict[str, TrainRecipe]) -> Dict[str, TrainRecipe]:
    for key in list(recipes):
        settings = dict(_FIT_80GB.get((token, key), {}))
        if settings:
            recipes[key] = fit_80gb(recipes[key], with_cp=settings.pop('with_cp', False), **settings)
        if (token, key) in _SPREAD:
            recipes[key] = spread(recipes[key], _SPREAD[token, key])
    return recipes


def revit_recipes(token: str) -> Dict[str, TrainRecipe]:
    out = {recipe: borrow(VITDET_B, 'no ReViT-B detection recipe was published; ViTDet\'s ViT-B recipe (a plain ViT-B '
                                    'with a simple feature pyramid, as ours). Global attention keeps every score map '
                                    'at detection sizes: expect the memory of ViTDet\'s global blocks in all 12')
           for recipe in ('mask_rcnn_1x', 'mask_rcnn_3x', 'cascade_mask_rcnn_3x', 'retinanet_1x')}
    out['upernet_160k_ade20k'] = borrow(
        MMSEG_VIT_B, 'no ReViT-B segmentation recipe was published; mmseg\'s ViT-B UperNet recipe')
    out['fpn_80k_ade20k'] = borrow(PVT_FPN, 'no ReViT-B Semantic FPN recipe was published; PVT\'s',
                                   no_decay=('alpha', ), deviations=PVT_FPN.deviations + (_GATE, ))
    return out


MMSEG_VIT_B = TrainRecipe(
    'MAE ViT-B UperNet 160k', f'{MMSEG_SWIN}:configs/mae/mae-base_upernet_8xb2-amp-160k_ade20k-512x512.py', True,
    _adamw(1e-4, 0.05), drop_path_rate=0.1, no_decay=('norm', 'pos_embed', 'alpha'), warmup_iters=1500,
    warmup_ratio=1e-6,
    lines=dict(optimizer=':28-33 AdamW 1e-4, betas (0.9, 0.999), wd 0.05', paramwise=':32-33 layer decay 0.65',
               warmup=':36-37 LinearLR 1500 iterations at 1e-6', schedule=':38-45 PolyLR power 1.0 to 0 over 160k',
               drop_path=':19', batch=':52 batch_size=2 x 8 GPUs (config name)',
               amp=':49 fp16 = dict(loss_scale=\'dynamic\'), a key mmengine does not read: its OptimWrapper trains '
                   'in fp32'),
    deviations=('no layer-wise lr decay (0.65): norms, the position embedding and the gate without weight decay '
                'instead', ))


# ---------------------------------------------------------------------------------------------------------------
# Shunted Transformer: the PVTv2 harness its author points to (Shunted-Transformer issue #17)

_PVT_WHY = ('Shunted published no downstream configs; its author points to the PVTv2 detection / segmentation '
            'code (Shunted-Transformer issue #17)')


def shunted_recipes(token: str) -> Dict[str, TrainRecipe]:
    mask_1x = TrainRecipe(
        'PVTv2-b2 Mask R-CNN 1x', f'{PVT}:detection/configs/mask_rcnn_pvt_v2_b2_fpn_1x_coco.py', True,
        _adamw(2e-4, 1e-4, betas=False), drop_path_rate=0.1,
        lines=dict(optimizer=':20 (no paramwise_cfg: every parameter decayed)',
                   drop_path='detection/pvt_v2.py:365 (pvt_v2_b2 drop_path_rate=0.1)',
                   schedule='_base_/schedules/schedule_1x.py', warmup='_base_/schedules/schedule_1x.py:5-11',
                   batch='_base_/datasets/coco_instance.py:32 (samples_per_gpu=2; 8 GPUs)', amp='none'),
        why=_PVT_WHY)
    mask_3x = TrainRecipe(
        'PVTv2-b2 Mask R-CNN 3x', f'{PVT}:detection/configs/mask_rcnn_pvt_v2_b2_fpn_3x_mstrain.py', True,
        _adamw(1e-4, 0.05), drop_path_rate=0.1, no_decay=SWIN_KEYS,
        lines=dict(optimizer=':64-67', paramwise=':64-67', schedule=':68-69', drop_path=mask_1x.lines['drop_path'],
                   warmup='_base_/schedules/schedule_1x.py:5-11', batch=mask_1x.lines['batch'], amp='none'),
        why=_PVT_WHY)
    cascade = TrainRecipe(
        'PVTv2-b2 Cascade Mask R-CNN 3x', f'{PVT}:detection/configs/cascade_mask_rcnn_pvt_v2_b2_fpn_3x_mstrain_fp16.py',
        True, _adamw(1e-4, 0.05), drop_path_rate=0.1, no_decay=SWIN_KEYS, amp='dynamic',
        lines=dict(optimizer=':124-127', paramwise=':124-127', schedule=':128-134',
                   drop_path=mask_1x.lines['drop_path'], warmup='_base_/schedules/schedule_1x.py:5-11',
                   batch=mask_1x.lines['batch'], amp=':134-143 EpochBasedRunnerAmp + apex (use_fp16=True)'),
        deviations=(_APEX, ),
        why=_PVT_WHY)
    retina = TrainRecipe(
        'PVTv2-b2 RetinaNet 1x', f'{PVT}:detection/configs/retinanet_pvt_v2_b2_fpn_1x_coco.py', True,
        _adamw(1e-4, 1e-4, betas=False), drop_path_rate=0.1,
        lines=dict(optimizer=':22 (no paramwise_cfg)', drop_path=mask_1x.lines['drop_path'],
                   warmup='_base_/schedules/schedule_1x.py:5-11', batch=mask_1x.lines['batch'], amp='none'),
        deviations=_RETINANET, why=_PVT_WHY)
    shunted_reported = {'mask_rcnn_1x': 'the Shunted paper\'s Mask R-CNN 1x row (COCO)',
                        'retinanet_1x': 'the Shunted paper\'s RetinaNet 1x row (COCO)'}
    out = {k: dataclasses.replace(v, reported=shunted_reported.get(k, ''))
           for k, v in dict(mask_rcnn_1x=mask_1x, mask_rcnn_3x=mask_3x, cascade_mask_rcnn_3x=cascade,
                            retinanet_1x=retina).items()}
    out['fpn_80k_ade20k'] = dataclasses.replace(PVT_FPN, why=_PVT_WHY)
    out['upernet_160k_ade20k'] = borrow(SWIN_UPERNET, 'neither Shunted nor PVT published an UperNet recipe; the Swin '
                                                      'UperNet recipe (norms without weight decay, as it has)',
                                        drop_path_rate=0.1)
    return out


# ---------------------------------------------------------------------------------------------------------------

def _family_recipes(token: str) -> Dict[str, TrainRecipe]:
    form, size = token.rsplit('_', 1)
    if form in ('rmt', 'evt'):
        return rmt_recipes(token, size)
    if form == 'evt_swin':
        return swin_recipes(token, f'EVT-Swin-{size.upper()}', _SWIN_DP[size], {})
    if form.startswith('fan_'):
        return fan_recipes(token, form[4:], size)
    if form == 'reswin':
        dp = _SWIN_DP[size]
        # the released ReSwin-T weights were trained with the official code's constant mix (ADiko1997/ReViT
        # model/reswin.py); ReSwin-S/B start from Swin weights, where the learnable gate is ours to train
        backbone = dict(residual_mode='official') if size == 't' else {}
        # the learnable residual gate of ReSwin-S/B without weight decay (ReSwin-T's official mode has none)
        return swin_recipes(token, f'ReSwin-{size.upper()}', dp, backbone,
                            extra_no_decay=() if size == 't' else ('alpha', ),
                            official=('cascade_mask_rcnn_3x', ) if size == 't' else (),
                            reported=dict(cascade_mask_rcnn_3x='the ReViT paper\'s ReSwin-T detector (Cascade Mask '
                                                               'R-CNN 3x, COCO)'))
    if form == 'remvit':
        return remvit_recipes(token, size)
    if form == 'revit':
        return revit_recipes(token)
    if form == 'shunted':
        return shunted_recipes(token)
    raise KeyError(f'no recipes for backbone token {token!r}')


def recipe_for(token: str, recipe: str) -> TrainRecipe:
    """The recipe of the task config of backbone ``token`` (``configs/_base_/backbones/<token>.py``) and dense
    ``recipe`` (a key of :data:`SCHEDULES`)."""
    recipes = _fit_80gb(token, _family_recipes(token))
    if recipe not in recipes:
        raise KeyError(f'no {recipe!r} recipe for {token!r}; dense recipes: {sorted(recipes)}')
    return recipes[recipe]


# ---------------------------------------------------------------------------------------------------------------
# Where a paper and its released code disagree. The configs follow the code whose weights were released (the
# weights are what users start from), and say so; docs/recipes.md lists both sides.

@dataclass(frozen=True)
class PaperVsCode:
    model: str
    setting: str
    paper: str  # what the paper states, with its arXiv number and section
    code: str  # what the released code does, with its source
    config: str  # what our configs use
    why: str


_REVIT_SEED = 'ReViT paper, arXiv 2402.11301, Implementation Details'
PAPER_VS_CODE: Tuple[PaperVsCode, ...] = (
    PaperVsCode('ReViT-B', 'ImageNet batch, gradient clipping',
                f'Adam, lr 1e-3, 30 warmup epochs, effective batch 4096, weight decay 0.3, gradient clipping '
                f'({_REVIT_SEED})',
                'lr 1e-3 at effective batch 8192 (base 6.25e-5 x 256 x 2 GPUs x accumulation 16 / 512), no gradient '
                'clipping (ADiko1997/ReViT ImageNet config and main.py)',
                'the code: batch 8192, lr 1e-3, no clipping (`configs/imagenet_revit_b.py`)',
                'the released ReViT-B weights come from that run; `--auto-scale-lr` rescales the lr for a batch of '
                '4096'),
    PaperVsCode('ReSwin-T', 'ImageNet lr, gradient clipping',
                f'AdamW, lr 1e-3, 20 warmup epochs, batch 1024, weight decay 0.05, gradient clipping ({_REVIT_SEED})',
                'lr 5e-4 (base 2.5e-4 x 1024 / 512) at batch 1024, no gradient clipping (ADiko1997/ReViT ImageNet '
                'config and main.py)',
                'the code: lr 5e-4, no clipping (`configs/imagenet_reswin_t.py`)',
                'the released ReSwin-T weights come from that run'),
    PaperVsCode('ReMViTv2-T', 'ImageNet batch, weight decay',
                f'AdamW, lr 2e-3, 70 warmup epochs, effective batch 2048, weight decay 0.1, gradient clipping '
                f'({_REVIT_SEED})',
                'lr 2e-3 at effective batch 4096 (base 2.5e-4 x 256 x 2 GPUs x accumulation 8 / 512), weight decay '
                '0.05, gradient clipping 1.0 (ADiko1997/ReViT ImageNet config and main.py)',
                'the code: batch 4096, weight decay 0.05, clipping 1.0 (`configs/imagenet_remvit_t.py`)',
                'the released ReMViTv2-T weights come from that run'),
    PaperVsCode('ReSwin-T, ReMViTv2-T', 'detection schedule',
                f'AdamW with a linear schedule of learning-rate decay, 36 epochs; ReSwin-T lr 1e-4, weight decay '
                f'0.05, batch 16; ReMViTv2-T lr 1.6e-4, weight decay 0.1, batch 64 ({_REVIT_SEED})',
                'the official Swin Cascade Mask R-CNN 3x (steps at epochs 27 and 33 after a linear warmup) and '
                'Detectron2\'s MViTv2-T Mask R-CNN 3x (steps at 52,500 and 62,500 of 67,500 iterations), which the '
                'paper says it trains with ("the same configuration as their official reports")',
                'the step schedules (`cascade_mask_rcnn_reswin_t_3x.py`, `mask_rcnn_remvit_t_3x.py`); lr, weight '
                'decay and batch agree with the paper',
                'no ReViT detection config was released; the "linear" schedule matches only the warmup of the '
                'official files the paper names'),
    PaperVsCode('ReMViTv2-T', 'depth',
                f'MViTv2-T and Swin-T "each with 12 layers" ({_REVIT_SEED})',
                'MViTv2-T has 10 blocks (1-2-5-2) in facebookresearch/mvit and in ADiko1997/ReViT; Swin-T has 12 '
                '(2-2-6-2)', 'the code: `ReMViTv2(arch=\'t\')` has 1-2-5-2',
                'the released ReMViTv2-T weights have 10 blocks (24.17M parameters, equal to the official count)'),
    PaperVsCode('RMT-T/S/B/L', 'detection lr and batch',
                'lr 1e-4, batch 16 (RMT paper v5)',
                'AdamW lr 4e-4 (T/S/B 1x, S 3x) or 2e-4 (L 1x, B/L 3x), 8 GPUs x 2 images (qhfan/RMT '
                'detect/configs/RMT)',
                'the code\'s values (`mask_rcnn_rmt_*`, `cascade_mask_rcnn_rmt_*`, `retinanet_rmt_*`)',
                'the configs the authors released and ran'),
    PaperVsCode('RMT-T/S/B/L', 'how the decay is applied',
                'the attention is softmax(Q K^T) multiplied by D (RMT paper v5 eq. 5)',
                'log D is added to the logits before the softmax, i.e. softmax(Q K^T) * D renormalised per row '
                '(qhfan/RMT; the author confirms it in issue #21)',
                'the code (RMT; EVT does the same with its Euclidean D)',
                'parity with the released weights; the renormalised form keeps each row a distribution'),
    PaperVsCode('RMT-T', 'which stages decompose MaSA',
                'the first three stages (RMT paper v5)',
                'stages 1-2 only for RMT-T (`RMT_T3`), stages 1-3 for S/B/L',
                'the code', 'parity with the released RMT-T weights'),
    PaperVsCode('RMT', 'stem',
                'five 3x3 convolutions (RMT paper v5 App. A)',
                'four 3x3 convolutions (qhfan/RMT `PatchEmbed`)', 'the code (RMT and EVT)',
                'parity with the released weights'),
)


__all__ = ['GPUS', 'PAPER_VS_CODE', 'SCHEDULES', 'DENSE_RECIPES', 'PaperVsCode', 'Schedule', 'TrainRecipe', 'borrow',
           'recipe_for']
