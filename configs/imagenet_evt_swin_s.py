# ImageNet-1k classifier with the official head layout; evaluates a converted official checkpoint
# (tools/model_converters/convert.py, then tools/test.py) or trains 300 epochs, with EVT-Swin-S.
# Recipe: Swin ImageNet recipe (AdamW 1e-3, wd 0.05, batch 1024); backbone settings in _base_/backbones/evt_swin_s.py.
# Written by tools/misc/generate_configs.py from mmvisatt/recipes.py and mmvisatt/task_configs.py: edit those, not
# this.
_base_ = [
    '_base_/models/image_classifier.py',
    '_base_/datasets/imagenet.py',
    '_base_/schedules/imagenet_300e.py',
    '_base_/default_runtime_cls.py',
    '_base_/backbones/evt_swin_s.py',
]

model = dict(
    backbone=dict(_base_.preset.backbone, drop_path_rate=_base_.preset.cls.drop_path_rate,
                  out_indices=(_base_.preset.cls.out_index, ),
                  **_base_.preset.cls.get('backbone', {})),
    neck=_base_.preset.cls.get('neck', dict(type='GlobalAveragePooling')),
    head=dict(in_channels=_base_.preset.cls.channels))
optim_wrapper = dict(
    optimizer=_base_.preset.cls.optimizer,
    clip_grad=_base_.preset.cls.clip_grad,
    # biases, norms and every 1-D parameter (alpha included) without weight decay, as the official runs
    paramwise_cfg=dict(norm_decay_mult=0., bias_decay_mult=0., flat_decay_mult=0.,
                       custom_keys={key: dict(decay_mult=0.) for key in _base_.preset.no_decay}))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, end=_base_.preset.cls.warmup_epochs,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=True, begin=_base_.preset.cls.warmup_epochs)
]
auto_scale_lr = dict(base_batch_size=_base_.preset.cls.batch_size)
val_dataloader = dict(dataset=dict(pipeline=[
    dict(type='LoadCheckedImageFromFile'),
    dict(type='ResizeEdge', scale=_base_.preset.cls.test_resize, edge='short', backend='pillow',
         interpolation='bicubic'),
    dict(type='CenterCrop', crop_size=224),
    dict(type='PackInputs'),
]))
test_dataloader = val_dataloader
