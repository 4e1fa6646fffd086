# Mask R-CNN + FPN, 3x schedule (36 epochs) with multi-scale training and crops, with Shunted-S.
# Recipe: official PVTv2-b2 Mask R-CNN 3x
# (whai362/PVT@57e2dfa:detection/configs/mask_rcnn_pvt_v2_b2_fpn_3x_mstrain.py); AdamW 0.0001, wd 0.05, total batch 16
# = 8 GPUs x 2, float32.
# Why: Shunted published no downstream configs; its author points to the PVTv2 detection / segmentation code (Shunted-
# Transformer issue #17).
# Every value with its source line, and each deviation with its reason: docs/recipes.md. Backbone settings in
# _base_/backbones/shunted_s.py.
# Written by tools/misc/generate_configs.py from mmvisatt/recipes.py and mmvisatt/task_configs.py: edit those, not
# this.
_base_ = [
    '_base_/models/mask_rcnn_fpn.py',
    '_base_/datasets/coco_instance_ms_crop.py',
    '_base_/schedules/schedule_3x.py',
    '_base_/default_runtime_det.py',
    '_base_/backbones/shunted_s.py',
]

model = dict(
    backbone=dict(_base_.preset.backbone, drop_path_rate=0.1),
    neck=dict(in_channels=_base_.preset.channels))
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=0.0001, weight_decay=0.05, betas=(0.9, 0.999)),
    paramwise_cfg=dict(
        custom_keys=dict(
            absolute_pos_embed=dict(decay_mult=0.0),
            relative_position_bias_table=dict(decay_mult=0.0),
            norm=dict(decay_mult=0.0))))
auto_scale_lr = dict(enable=False, base_batch_size=16)
