# UperNet (+ FCN auxiliary head), 160k iterations, ADE20K 512x512, with EVT-T.
# Recipe: borrowed from RMT-S UperNet 160k (qhfan/RMT@32ea214:segmentation/configs/RMT/RMT_Uper_s_2x.py); AdamW 6e-05,
# wd 0.01, total batch 16 = 8 GPUs x 2, fp16 AMP (static loss scale 512).
# Why: EVT published no downstream recipes (its paper names MMDetection, AdamW, 1x and 3x + MS, and Swin / PVT's
# ADE20K schedules); those of RMT of the same size, the network EVT extends (conv stem, CPE, decayed attention), with
# EVT's drop path.
# Every value with its source line, and each deviation with its reason: docs/recipes.md. Backbone settings in
# _base_/backbones/evt_t.py.
# Written by tools/misc/generate_configs.py from mmvisatt/recipes.py and mmvisatt/task_configs.py: edit those, not
# this.
_base_ = [
    '_base_/models/upernet.py',
    '_base_/datasets/ade20k.py',
    '_base_/schedules/schedule_160k.py',
    '_base_/default_runtime_seg.py',
    '_base_/backbones/evt_t.py',
]

model = dict(
    backbone=dict(_base_.preset.backbone, drop_path_rate=0.1,
                  norm_cfg=dict(type='SyncBN')),
    decode_head=dict(in_channels=_base_.preset.channels),
    auxiliary_head=dict(in_channels=_base_.preset.channels[2]))
optim_wrapper = dict(
    type='AmpOptimWrapper',
    loss_scale=512.0,
    optimizer=dict(type='AdamW', lr=6e-05, weight_decay=0.01, betas=(0.9, 0.999)),
    paramwise_cfg=dict(
        custom_keys=dict(
            absolute_pos_embed=dict(decay_mult=0.0),
            relative_position_bias_table=dict(decay_mult=0.0),
            norm=dict(decay_mult=0.0))))
auto_scale_lr = dict(enable=False, base_batch_size=16)
