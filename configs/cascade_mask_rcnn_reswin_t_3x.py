# Cascade Mask R-CNN (4conv1fc box heads, GIoU) + ReSwin-T, 3x schedule with multi-scale training and crops:
# the detector of the ReViT paper. Recipe of the Swin-T Cascade Mask R-CNN 3x row of the Swin detection model zoo
# (Swin-Transformer-Object-Detection, cascade_mask_rcnn_swin_tiny_patch4_window7_mstrain_480-800_giou_4conv1f_
# adamw_3x_coco: 50.4 box AP / 43.7 mask AP for plain Swin-T), with the backbone replaced by ReSwin-T.
# Batch 16 = 8 GPUs x 2 images.
_base_ = [
    '_base_/models/cascade_mask_rcnn_fpn_4conv1fc_giou.py',
    '_base_/datasets/coco_instance_ms_crop.py',
    '_base_/schedules/schedule_3x.py',
    '_base_/default_runtime_det.py',
]

# ImageNet-1k ReSwin-T weights. Google Drive only: follow the ReSwin-T link in the README of
# https://github.com/ADiko1997/ReViT and save the file here. The official Swin-T weights also work as an init
# (alpha then starts from its default):
# https://github.com/SwinTransformer/storage/releases/download/v1.0.0/swin_tiny_patch4_window7_224.pth
pretrained = 'checkpoints/reswin_tiny_patch4_window7_224.pth'
pretrained_source = ('the ReSwin-T link (Google Drive) in the README of https://github.com/ADiko1997/ReViT; the '
                     'official Swin-T file https://github.com/SwinTransformer/storage/releases/download/v1.0.0/'
                     'swin_tiny_patch4_window7_224.pth also works as an init')

model = dict(
    backbone=dict(
        type='ReSwinTransformer',
        arch='t',
        residual_mode='aligned',
        drop_path_rate=0.2,
        out_indices=(0, 1, 2, 3),
        frozen_stages=-1,
        norm_eval=False,
        with_cp=False,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[96, 192, 384, 768]))

# AdamW without weight decay on norms, position tables and the residual-attention gate alpha (backbone.alpha)
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=dict(
        custom_keys={
            'norm': dict(decay_mult=0.),
            'relative_position_bias_table': dict(decay_mult=0.),
            'absolute_pos_embed': dict(decay_mult=0.),
            'alpha': dict(decay_mult=0.),
        }))
