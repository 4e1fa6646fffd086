# RetinaNet + FPN, 1x schedule, COCO detection, with EVT-T.
# Recipe: borrowed from RMT-T RetinaNet 1x (qhfan/RMT@32ea214:detect/configs/RMT/retinanet_t_1x.py); AdamW 0.0004, wd
# 0.0001, total batch 16 = 8 GPUs x 2, fp16 AMP (static loss scale 512).
# Why: EVT published no downstream recipes (its paper names MMDetection, AdamW, 1x and 3x + MS, and Swin / PVT's
# ADE20K schedules); those of RMT of the same size, the network EVT extends (conv stem, CPE, decayed attention), with
# EVT's drop path.
# Every value with its source line, and each deviation with its reason: docs/recipes.md. Backbone settings in
# _base_/backbones/evt_t.py.
# Written by tools/misc/generate_configs.py from mmvisatt/recipes.py and mmvisatt/task_configs.py: edit those, not
# this.
_base_ = [
    '_base_/models/retinanet_fpn.py',
    '_base_/datasets/coco_detection.py',
    '_base_/schedules/schedule_1x.py',
    '_base_/default_runtime_det.py',
    '_base_/backbones/evt_t.py',
]

model = dict(
    backbone=dict(_base_.preset.backbone, drop_path_rate=0.1,
                  norm_cfg=dict(type='SyncBN'),
                  out_indices=(1, 2, 3)),
    neck=dict(in_channels=_base_.preset.channels[1:], start_level=0))
optim_wrapper = dict(
    type='AmpOptimWrapper',
    loss_scale=512.0,
    optimizer=dict(type='AdamW', lr=0.0004, weight_decay=0.0001))
auto_scale_lr = dict(enable=False, base_batch_size=16)
