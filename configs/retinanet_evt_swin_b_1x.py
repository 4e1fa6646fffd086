# RetinaNet + FPN, 1x schedule, COCO detection, with EVT-Swin-B.
# Recipe: borrowed from Swin-T Mask R-CNN 1x (EVT-Swin-B) (SwinTransformer/Swin-Transformer-Object-
# Detection@c7b2011:configs/swin/mask_rcnn_swin_tiny_patch4_window7_mstrain_480-800_adamw_1x_coco.py); AdamW 0.0001,
# wd 0.05, total batch 16 = 8 GPUs x 2, fp16 AMP (dynamic loss scale).
# Why: no EVT-Swin-B retinanet_1x config was published; the official Swin-T detection recipe of that schedule.
# Every value with its source line, and each deviation with its reason: docs/recipes.md. Backbone settings in
# _base_/backbones/evt_swin_b.py.
# Written by tools/misc/generate_configs.py from mmvisatt/recipes.py and mmvisatt/task_configs.py: edit those, not
# this.
_base_ = [
    '_base_/models/retinanet_fpn.py',
    '_base_/datasets/coco_detection.py',
    '_base_/schedules/schedule_1x.py',
    '_base_/default_runtime_det.py',
    '_base_/backbones/evt_swin_b.py',
]

model = dict(
    backbone=dict(_base_.preset.backbone, drop_path_rate=0.3,
                  out_indices=(1, 2, 3)),
    neck=dict(in_channels=_base_.preset.channels[1:], start_level=0))
optim_wrapper = dict(
    type='AmpOptimWrapper',
    optimizer=dict(type='AdamW', lr=0.0001, weight_decay=0.05, betas=(0.9, 0.999)),
    paramwise_cfg=dict(
        custom_keys=dict(
            absolute_pos_embed=dict(decay_mult=0.0),
            relative_position_bias_table=dict(decay_mult=0.0),
            norm=dict(decay_mult=0.0))))
auto_scale_lr = dict(enable=False, base_batch_size=16)
