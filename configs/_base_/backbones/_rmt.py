# The official RMT recipes (qhfan/RMT detection / segmentation / classification code), shared by the RMT presets
# and, as EVT published none, by the EVT presets. A preset inherits this file and adds its backbone, channels,
# drop path rate (the same in every official det/seg config of a size) and the learning rates that differ for
# its size (its `preset` dict merges into this one). Detection and segmentation run on 8 GPUs x 2 images.
preset = dict(
    # the official det/seg configs exclude norms from weight decay
    no_decay=['norm'],
    det=dict(batch_size=16, recipe='official RMT Mask R-CNN 1x (AdamW 4e-4, wd 0.05, batch 16)',
             optimizer=dict(type='AdamW', lr=4e-4, betas=(0.9, 0.999), weight_decay=0.05)),
    mask_rcnn_3x=dict(batch_size=16, recipe='official RMT Mask R-CNN 3x (AdamW 4e-4, wd 0.05, batch 16)',
                      optimizer=dict(type='AdamW', lr=4e-4, betas=(0.9, 0.999), weight_decay=0.05)),
    cascade_mask_rcnn_3x=dict(batch_size=16,
                              recipe='official RMT Cascade Mask R-CNN 3x (AdamW 4e-4, wd 0.05, batch 16)',
                              optimizer=dict(type='AdamW', lr=4e-4, betas=(0.9, 0.999), weight_decay=0.05)),
    retinanet_1x=dict(batch_size=16, recipe='official RMT RetinaNet 1x (AdamW 4e-4, wd 1e-4, batch 16)',
                      optimizer=dict(type='AdamW', lr=4e-4, betas=(0.9, 0.999), weight_decay=1e-4)),
    seg=dict(recipe='official RMT UperNet 160k (AdamW 6e-5, wd 0.01, batch 16)',
             optimizer=dict(type='AdamW', lr=6e-5, betas=(0.9, 0.999), weight_decay=0.01)),
    fpn=dict(recipe='official RMT Semantic FPN 80k (AdamW 1e-4, wd 1e-4, batch 16)',
             optimizer=dict(type='AdamW', lr=1e-4, weight_decay=1e-4)),
    # ImageNet: the official DeiT-style run (AdamW 1e-3 at batch 1024, 5 warmup epochs; EMA not reproduced). The
    # official head projects the raw last stage to 1024 channels (BatchNorm, Swish) before pooling.
    cls=dict(out_index=3, channels=1024, batch_size=1024, warmup_epochs=5, test_resize=256, clip_grad=None,
             recipe='official RMT ImageNet run (AdamW 1e-3, wd 0.05, batch 1024)',
             backbone=dict(out_norms=False), neck=dict(type='RMTProjectionNeck', projection=1024),
             optimizer=dict(type='AdamW', lr=1e-3, betas=(0.9, 0.999), weight_decay=0.05, eps=1e-8)),
    reported=dict(mask_rcnn_1x='the RMT paper\'s Mask R-CNN 1x rows (COCO)',
                  retinanet_1x='the RMT paper\'s RetinaNet 1x rows (COCO)',
                  upernet_160k_ade20k='the RMT paper\'s UperNet rows (ADE20K)',
                  fpn_80k_ade20k='the RMT paper\'s Semantic FPN rows (ADE20K)'))
