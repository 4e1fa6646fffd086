# RetinaNet + FPN, 1x schedule, COCO detection, with Shunted-B.
# Recipe: official PVTv2-b2 RetinaNet 1x (whai362/PVT@57e2dfa:detection/configs/retinanet_pvt_v2_b2_fpn_1x_coco.py);
# AdamW 0.0001, wd 0.0001, total batch 16 = 8 GPUs x 2, float32.
# Why: Shunted published no downstream configs; its author points to the PVTv2 detection / segmentation code (Shunted-
# Transformer issue #17).
# Reported: the Shunted paper's RetinaNet 1x row (COCO).
# Every value with its source line, and each deviation with its reason: docs/recipes.md. Backbone settings in
# _base_/backbones/shunted_b.py.
# Written by tools/misc/generate_configs.py from mmvisatt/recipes.py and mmvisatt/task_configs.py: edit those, not
# this.
_base_ = [
    '_base_/models/retinanet_fpn.py',
    '_base_/datasets/coco_detection.py',
    '_base_/schedules/schedule_1x.py',
    '_base_/default_runtime_det.py',
    '_base_/backbones/shunted_b.py',
]

model = dict(
    backbone=dict(_base_.preset.backbone, drop_path_rate=0.1,
                  out_indices=(1, 2, 3)),
    neck=dict(in_channels=_base_.preset.channels[1:], start_level=0))
optim_wrapper = dict(type='OptimWrapper', optimizer=dict(type='AdamW', lr=0.0001, weight_decay=0.0001))
auto_scale_lr = dict(enable=False, base_batch_size=16)
