# UperNet (+ FCN auxiliary head), 160k iterations, ADE20K 512x512, with Shunted-T.
# Recipe: Swin UperNet recipe (AdamW 6e-5, wd 0.01, batch 16); backbone settings in _base_/backbones/shunted_t.py.
# Written by tools/misc/generate_configs.py from mmvisatt/task_configs.py: edit those, not this.
_base_ = [
    '_base_/models/upernet.py',
    '_base_/datasets/ade20k.py',
    '_base_/schedules/schedule_160k.py',
    '_base_/default_runtime_seg.py',
    '_base_/backbones/shunted_t.py',
]

model = dict(
    backbone=dict(_base_.preset.backbone, drop_path_rate=_base_.preset.drop_path_rate),
    decode_head=dict(in_channels=_base_.preset.channels),
    auxiliary_head=dict(in_channels=_base_.preset.channels[2]))
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=_base_.preset.seg.optimizer,
    paramwise_cfg=dict(custom_keys={key: dict(decay_mult=0.) for key in _base_.preset.no_decay}))
