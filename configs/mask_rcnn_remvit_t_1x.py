# Mask R-CNN + FPN, 1x schedule (12 epochs), single-scale COCO instance training, with ReMViTv2-T.
# Recipe: borrowed from ReMViTv2-T Mask R-CNN 3x (ReMViTv2-T)
# (facebookresearch/detectron2@87b1bf9:projects/MViTv2/configs/mask_rcnn_mvitv2_t_3x.py); AdamW 0.00016, wd 0.1, total
# batch 64 = 8 GPUs x 8, fp16 AMP (dynamic loss scale).
# Why: the paper trained only the ReMViTv2-T Mask R-CNN 3x; its recipe (the Detectron2 MViTv2 one).
# Every value with its source line, and each deviation with its reason: docs/recipes.md. Backbone settings in
# _base_/backbones/remvit_t.py.
# Written by tools/misc/generate_configs.py from mmvisatt/recipes.py and mmvisatt/task_configs.py: edit those, not
# this.
_base_ = [
    '_base_/models/mask_rcnn_fpn.py',
    '_base_/datasets/coco_instance.py',
    '_base_/schedules/schedule_1x.py',
    '_base_/default_runtime_det.py',
    '_base_/backbones/remvit_t.py',
]

model = dict(
    backbone=dict(_base_.preset.backbone, drop_path_rate=0.2),
    neck=dict(in_channels=_base_.preset.channels))
optim_wrapper = dict(
    type='AmpOptimWrapper',
    optimizer=dict(type='AdamW', lr=0.00016, weight_decay=0.1, betas=(0.9, 0.999)),
    paramwise_cfg=dict(
        custom_keys=dict(
            pos_embed=dict(decay_mult=0.0),
            rel_pos_h=dict(decay_mult=0.0),
            rel_pos_w=dict(decay_mult=0.0),
            norm=dict(decay_mult=0.0),
            alpha=dict(decay_mult=0.0))))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=250),
    dict(type='MultiStepLR', begin=0, end=12, by_epoch=True, milestones=[8, 11], gamma=0.1)
]
train_dataloader = dict(batch_size=8)
auto_scale_lr = dict(enable=False, base_batch_size=64)
