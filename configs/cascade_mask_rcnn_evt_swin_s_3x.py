# Cascade Mask R-CNN (4conv1fc box heads, GIoU) + FPN, 3x schedule with multi-scale training and crops, with EVT-
# Swin-S.
# Recipe: borrowed from Swin-T Cascade Mask R-CNN 3x (EVT-Swin-S) (SwinTransformer/Swin-Transformer-Object-Detection@c
# 7b2011:configs/swin/cascade_mask_rcnn_swin_tiny_patch4_window7_mstrain_480-800_giou_4conv1f_adamw_3x_coco.py); AdamW
# 0.0001, wd 0.05, total batch 16 = 8 GPUs x 2, fp16 AMP (dynamic loss scale).
# Why: no EVT-Swin-S cascade_mask_rcnn_3x config was published; the official Swin-T detection recipe of that schedule.
# Every value with its source line, and each deviation with its reason: docs/recipes.md. Backbone settings in
# _base_/backbones/evt_swin_s.py.
# Written by tools/misc/generate_configs.py from mmvisatt/recipes.py and mmvisatt/task_configs.py: edit those, not
# this.
_base_ = [
    '_base_/models/cascade_mask_rcnn_fpn_4conv1fc_giou.py',
    '_base_/datasets/coco_instance_ms_crop.py',
    '_base_/schedules/schedule_3x.py',
    '_base_/default_runtime_det.py',
    '_base_/backbones/evt_swin_s.py',
]

model = dict(
    backbone=dict(_base_.preset.backbone, drop_path_rate=0.3),
    neck=dict(in_channels=_base_.preset.channels))
optim_wrapper = dict(
    type='AmpOptimWrapper',
    optimizer=dict(type='AdamW', lr=0.0001, weight_decay=0.05, betas=(0.9, 0.999)),
    paramwise_cfg=dict(
        custom_keys=dict(
            absolute_pos_embed=dict(decay_mult=0.0),
            relative_position_bias_table=dict(decay_mult=0.0),
            norm=dict(decay_mult=0.0))))
auto_scale_lr = dict(enable=False, base_batch_size=16)
