# Mask R-CNN + FPN, 3x schedule (36 epochs) with multi-scale training and crops, with FAN-L-Swin.
# Recipe: borrowed from FAN-L-Hybrid Cascade Mask R-CNN 3x
# (NVlabs/FAN@ee1b7df:detection/configs/cascade_mask_fan_large_fpn_3x_mstrain_fp16.py); AdamW 0.0001, wd 0.05, total
# batch 32 = 8 GPUs x 4, fp16 AMP (dynamic loss scale).
# Why: FAN published COCO recipes for the hybrid Cascade Mask R-CNN 3x only; its optimizer, batch and AMP.
# Memory: with_cp=True: at 4 images per GPU the training step is over 80 GB without it (docs/benchmarks.md, Memory per
# GPU); the total batch stays 32.
# Measured per GPU (docs/benchmarks.md): 18.3 GB at 4 images per GPU in AMP (fp16); 84.5 GB without with_cp=True.
# Every value with its source line, and each deviation with its reason: docs/recipes.md. Backbone settings in
# _base_/backbones/fan_swin_l.py.
# Written by tools/misc/generate_configs.py from mmvisatt/recipes.py and mmvisatt/task_configs.py: edit those, not
# this.
_base_ = [
    '_base_/models/mask_rcnn_fpn.py',
    '_base_/datasets/coco_instance_ms_crop.py',
    '_base_/schedules/schedule_3x.py',
    '_base_/default_runtime_det.py',
    '_base_/backbones/fan_swin_l.py',
]

model = dict(
    backbone=dict(_base_.preset.backbone, drop_path_rate=0.3,
                  norm_cfg=dict(type='SyncBN'),
                  with_cp=True),
    neck=dict(in_channels=_base_.preset.channels))
optim_wrapper = dict(
    type='AmpOptimWrapper',
    optimizer=dict(type='AdamW', lr=0.0001, weight_decay=0.05, betas=(0.9, 0.999)),
    paramwise_cfg=dict(
        custom_keys=dict(
            absolute_pos_embed=dict(decay_mult=0.0),
            relative_position_bias_table=dict(decay_mult=0.0),
            norm=dict(decay_mult=0.0))))
train_dataloader = dict(batch_size=4)
auto_scale_lr = dict(enable=False, base_batch_size=32)
