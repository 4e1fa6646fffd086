# SegFormer head, 160k iterations, Cityscapes 1024x1024 crops, the official FAN segmentation recipe, with FAN-B-
# Hybrid.
# Recipe: official FAN-B-Hybrid SegFormer 160k Cityscapes
# (NVlabs/FAN@ee1b7df:segmentation/local_configs/fan/fan_hybrid/fan_hybrid_base.1024x1024.city.160k.py); AdamW 6e-05,
# wd 0.01, total batch 8 = 8 GPUs x 1, float32.
# Every value with its source line, and each deviation with its reason: docs/recipes.md. Backbone settings in
# _base_/backbones/fan_hybrid_b.py.
# Written by tools/misc/generate_configs.py from mmvisatt/recipes.py and mmvisatt/task_configs.py: edit those, not
# this.
_base_ = [
    '_base_/models/segformer.py',
    '_base_/datasets/cityscapes_1024x1024.py',
    '_base_/schedules/schedule_160k.py',
    '_base_/default_runtime_seg.py',
    '_base_/backbones/fan_hybrid_b.py',
]

model = dict(
    backbone=dict(_base_.preset.backbone, drop_path_rate=0.0,
                  norm_cfg=dict(type='SyncBN'),
                  out_norms=False,
                  pos_exponent='linear',
                  feat_downsample=False),
    decode_head=dict(in_channels=_base_.preset.channels[:3] + _base_.preset.channels[2:3]))
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=6e-05, weight_decay=0.01, betas=(0.9, 0.999)),
    paramwise_cfg=dict(
        custom_keys=dict(pos_block=dict(decay_mult=0.0), norm=dict(decay_mult=0.0), head=dict(lr_mult=10.0))))
auto_scale_lr = dict(enable=False, base_batch_size=8)
