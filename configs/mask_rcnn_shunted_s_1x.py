# Mask R-CNN + FPN, 1x schedule (12 epochs), single-scale COCO instance training, with Shunted-S.
# Recipe: official PVTv2-b2 Mask R-CNN 1x (whai362/PVT@57e2dfa:detection/configs/mask_rcnn_pvt_v2_b2_fpn_1x_coco.py);
# AdamW 0.0002, wd 0.0001, total batch 16 = 8 GPUs x 2, float32.
# Why: Shunted published no downstream configs; its author points to the PVTv2 detection / segmentation code (Shunted-
# Transformer issue #17).
# Reported: the Shunted paper's Mask R-CNN 1x row (COCO).
# Every value with its source line, and each deviation with its reason: docs/recipes.md. Backbone settings in
# _base_/backbones/shunted_s.py.
# Written by tools/misc/generate_configs.py from mmvisatt/recipes.py and mmvisatt/task_configs.py: edit those, not
# this.
_base_ = [
    '_base_/models/mask_rcnn_fpn.py',
    '_base_/datasets/coco_instance.py',
    '_base_/schedules/schedule_1x.py',
    '_base_/default_runtime_det.py',
    '_base_/backbones/shunted_s.py',
]

model = dict(
    backbone=dict(_base_.preset.backbone, drop_path_rate=0.1),
    neck=dict(in_channels=_base_.preset.channels))
optim_wrapper = dict(type='OptimWrapper', optimizer=dict(type='AdamW', lr=0.0002, weight_decay=0.0001))
auto_scale_lr = dict(enable=False, base_batch_size=16)
