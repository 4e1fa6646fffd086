# Cascade Mask R-CNN (4conv1fc box heads, GIoU) + FPN, 3x schedule with multi-scale training and crops, with EVT-T.
# Recipe: official RMT Cascade Mask R-CNN 3x (AdamW 4e-4, wd 0.05, batch 16); backbone settings in
# _base_/backbones/evt_t.py.
# Written by tools/misc/generate_configs.py from mmvisatt/task_configs.py: edit those, not this.
_base_ = [
    '_base_/models/cascade_mask_rcnn_fpn_4conv1fc_giou.py',
    '_base_/datasets/coco_instance_ms_crop.py',
    '_base_/schedules/schedule_3x.py',
    '_base_/default_runtime_det.py',
    '_base_/backbones/evt_t.py',
]

model = dict(
    backbone=dict(_base_.preset.backbone, drop_path_rate=_base_.preset.drop_path_rate),
    neck=dict(in_channels=_base_.preset.channels))
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=_base_.preset.cascade_mask_rcnn_3x.optimizer,
    paramwise_cfg=dict(custom_keys={key: dict(decay_mult=0.) for key in _base_.preset.no_decay}))
auto_scale_lr = dict(base_batch_size=_base_.preset.cascade_mask_rcnn_3x.batch_size)
