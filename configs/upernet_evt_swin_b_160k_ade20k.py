# UperNet (+ FCN auxiliary head), 160k iterations, ADE20K 512x512, with EVT-Swin-B.
# Recipe: borrowed from Swin-T UperNet 160k (open-mmlab/mmsegmentation@v1.2.2:configs/swin/swin-tiny-
# patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py); AdamW 6e-05, wd 0.01, total batch 16 = 8 GPUs x 2,
# float32.
# Why: no EVT-Swin-B UperNet config was published; the Swin UperNet recipe.
# Every value with its source line, and each deviation with its reason: docs/recipes.md. Backbone settings in
# _base_/backbones/evt_swin_b.py.
# Written by tools/misc/generate_configs.py from mmvisatt/recipes.py and mmvisatt/task_configs.py: edit those, not
# this.
_base_ = [
    '_base_/models/upernet.py',
    '_base_/datasets/ade20k.py',
    '_base_/schedules/schedule_160k.py',
    '_base_/default_runtime_seg.py',
    '_base_/backbones/evt_swin_b.py',
]

model = dict(
    backbone=dict(_base_.preset.backbone, drop_path_rate=0.3),
    decode_head=dict(in_channels=_base_.preset.channels),
    auxiliary_head=dict(in_channels=_base_.preset.channels[2]))
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=6e-05, weight_decay=0.01, betas=(0.9, 0.999)),
    paramwise_cfg=dict(
        custom_keys=dict(
            absolute_pos_embed=dict(decay_mult=0.0),
            relative_position_bias_table=dict(decay_mult=0.0),
            norm=dict(decay_mult=0.0))))
auto_scale_lr = dict(enable=False, base_batch_size=16)
