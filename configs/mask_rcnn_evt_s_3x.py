# Mask R-CNN + FPN, 3x schedule (36 epochs) with multi-scale training and crops, with EVT-S.
# Recipe: borrowed from RMT-S Mask R-CNN 3x (qhfan/RMT@32ea214:detect/configs/RMT/maskrcnn_s_3x.py); AdamW 0.0004, wd
# 0.05, total batch 16 = 8 GPUs x 2, fp16 AMP (dynamic loss scale).
# Why: EVT published no downstream recipes (its paper names MMDetection, AdamW, 1x and 3x + MS, and Swin / PVT's
# ADE20K schedules); those of RMT of the same size, the network EVT extends (conv stem, CPE, decayed attention), with
# EVT's drop path.
# Every value with its source line, and each deviation with its reason: docs/recipes.md. Backbone settings in
# _base_/backbones/evt_s.py.
# Written by tools/misc/generate_configs.py from mmvisatt/recipes.py and mmvisatt/task_configs.py: edit those, not
# this.
_base_ = [
    '_base_/models/mask_rcnn_fpn.py',
    '_base_/datasets/coco_instance_ms_crop.py',
    '_base_/schedules/schedule_3x.py',
    '_base_/default_runtime_det.py',
    '_base_/backbones/evt_s.py',
]

model = dict(
    backbone=dict(_base_.preset.backbone, drop_path_rate=0.15,
                  norm_cfg=dict(type='SyncBN')),
    neck=dict(in_channels=_base_.preset.channels))
optim_wrapper = dict(
    type='AmpOptimWrapper',
    optimizer=dict(type='AdamW', lr=0.0004, weight_decay=0.05, betas=(0.9, 0.999)),
    paramwise_cfg=dict(
        custom_keys=dict(
            absolute_pos_embed=dict(decay_mult=0.0),
            relative_position_bias_table=dict(decay_mult=0.0),
            norm=dict(decay_mult=0.0))))
auto_scale_lr = dict(enable=False, base_batch_size=16)
