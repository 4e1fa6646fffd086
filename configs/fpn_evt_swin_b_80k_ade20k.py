# Semantic FPN, 80k iterations, ADE20K 512x512, with EVT-Swin-B.
# Recipe: borrowed from PVT Semantic FPN
# (whai362/PVT@57e2dfa:segmentation/configs/sem_fpn/PVT/fpn_pvt_s_ade20k_40k.py); AdamW 0.0001, wd 0.0001, total batch
# 16 = 8 GPUs x 2, float32.
# Why: no EVT-Swin-B Semantic FPN config was published; PVT's.
# Every value with its source line, and each deviation with its reason: docs/recipes.md. Backbone settings in
# _base_/backbones/evt_swin_b.py.
# Written by tools/misc/generate_configs.py from mmvisatt/recipes.py and mmvisatt/task_configs.py: edit those, not
# this.
_base_ = [
    '_base_/models/semantic_fpn.py',
    '_base_/datasets/ade20k.py',
    '_base_/schedules/schedule_80k.py',
    '_base_/default_runtime_seg.py',
    '_base_/backbones/evt_swin_b.py',
]

model = dict(
    backbone=dict(_base_.preset.backbone, drop_path_rate=0.3),
    neck=dict(in_channels=_base_.preset.channels))
optim_wrapper = dict(type='OptimWrapper', optimizer=dict(type='AdamW', lr=0.0001, weight_decay=0.0001))
auto_scale_lr = dict(enable=False, base_batch_size=16)
