# Semantic FPN, 80k iterations, ADE20K 512x512, with EVT-B.
# Recipe: borrowed from RMT-B Semantic FPN 80k (qhfan/RMT@32ea214:segmentation/configs/RMT/RMT_FPN_m_1x.py); AdamW
# 0.0001, wd 0.0001, total batch 16 = 8 GPUs x 2, float32.
# Why: EVT published no downstream recipes (its paper names MMDetection, AdamW, 1x and 3x + MS, and Swin / PVT's
# ADE20K schedules); those of RMT of the same size, the network EVT extends (conv stem, CPE, decayed attention), with
# EVT's drop path.
# Every value with its source line, and each deviation with its reason: docs/recipes.md. Backbone settings in
# _base_/backbones/evt_b.py.
# Written by tools/misc/generate_configs.py from mmvisatt/recipes.py and mmvisatt/task_configs.py: edit those, not
# this.
_base_ = [
    '_base_/models/semantic_fpn.py',
    '_base_/datasets/ade20k.py',
    '_base_/schedules/schedule_80k.py',
    '_base_/default_runtime_seg.py',
    '_base_/backbones/evt_b.py',
]

model = dict(
    backbone=dict(_base_.preset.backbone, drop_path_rate=0.4,
                  norm_cfg=dict(type='SyncBN')),
    neck=dict(in_channels=_base_.preset.channels))
optim_wrapper = dict(type='OptimWrapper', optimizer=dict(type='AdamW', lr=0.0001, weight_decay=0.0001))
param_scheduler = [dict(type='PolyLR', eta_min=1e-06, power=0.9, begin=0, end=80000, by_epoch=False)]
auto_scale_lr = dict(enable=False, base_batch_size=16)
