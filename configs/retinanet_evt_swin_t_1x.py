# RetinaNet + FPN, 1x schedule, COCO detection, with EVT-Swin-T.
# Recipe: Swin detection recipe (AdamW 1e-4, wd 0.05, batch 16); backbone settings in _base_/backbones/evt_swin_t.py.
# Written by tools/misc/generate_configs.py from mmvisatt/task_configs.py: edit those, not this.
_base_ = [
    '_base_/models/retinanet_fpn.py',
    '_base_/datasets/coco_detection.py',
    '_base_/schedules/schedule_1x.py',
    '_base_/default_runtime_det.py',
    '_base_/backbones/evt_swin_t.py',
]

# The FPN reads strides 8-32 only; the stride-4 output is not built (its unused norm would stop DDP).
model = dict(
    backbone=dict(_base_.preset.backbone, drop_path_rate=_base_.preset.det.drop_path_rate,
                  out_indices=(1, 2, 3)),
    neck=dict(in_channels=_base_.preset.channels[1:], start_level=0))
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=_base_.preset.det.optimizer,
    paramwise_cfg=dict(custom_keys={key: dict(decay_mult=0.) for key in _base_.preset.no_decay}))
auto_scale_lr = dict(base_batch_size=_base_.preset.det.batch_size)
