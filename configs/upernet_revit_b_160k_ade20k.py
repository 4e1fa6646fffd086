# UperNet (+ FCN auxiliary head), 160k iterations, ADE20K 512x512, with ReViT-B.
# Recipe: borrowed from MAE ViT-B UperNet 160k (open-mmlab/mmsegmentation@v1.2.2:configs/mae/mae-
# base_upernet_8xb2-amp-160k_ade20k-512x512.py); AdamW 0.0001, wd 0.05, total batch 16 = 8 GPUs x 2, float32.
# Why: no ReViT-B segmentation recipe was published; mmseg's ViT-B UperNet recipe.
# Every value with its source line, and each deviation with its reason: docs/recipes.md. Backbone settings in
# _base_/backbones/revit_b.py.
# Written by tools/misc/generate_configs.py from mmvisatt/recipes.py and mmvisatt/task_configs.py: edit those, not
# this.
_base_ = [
    '_base_/models/upernet.py',
    '_base_/datasets/ade20k.py',
    '_base_/schedules/schedule_160k.py',
    '_base_/default_runtime_seg.py',
    '_base_/backbones/revit_b.py',
]

model = dict(
    backbone=dict(_base_.preset.backbone, drop_path_rate=0.1),
    decode_head=dict(in_channels=_base_.preset.channels),
    auxiliary_head=dict(in_channels=_base_.preset.channels[2]))
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=0.0001, weight_decay=0.05, betas=(0.9, 0.999)),
    paramwise_cfg=dict(
        custom_keys=dict(norm=dict(decay_mult=0.0), pos_embed=dict(decay_mult=0.0), alpha=dict(decay_mult=0.0))))
auto_scale_lr = dict(enable=False, base_batch_size=16)
