# What the Shunted Transformer presets share: the PVTv2 recipes the paper followed for COCO, the official ImageNet
# run. A preset inherits this file and adds its backbone, pretrained file and ImageNet drop path (its `preset`
# dict merges into this one).
preset = dict(
    channels=[64, 128, 256, 512],
    # PVTv2's detection backbones use drop path 0.1 for every size
    drop_path_rate=0.1,
    # the PVTv2 recipes decay every parameter (their weight decay 1e-4 is small)
    no_decay=[],
    # COCO: the PVTv2 Mask R-CNN recipe the paper followed for its 1x rows, 8 GPUs x 2; 3x and Cascade: the same
    # optimizer
    det=dict(batch_size=16, recipe='PVTv2 Mask R-CNN recipe (AdamW 2e-4, wd 1e-4, batch 16)',
             optimizer=dict(type='AdamW', lr=2e-4, weight_decay=1e-4)),
    retinanet_1x=dict(batch_size=16, recipe='PVTv2 RetinaNet recipe (AdamW 1e-4, wd 1e-4, batch 16)',
                      optimizer=dict(type='AdamW', lr=1e-4, weight_decay=1e-4)),
    # ADE20K UperNet: no Shunted/PVTv2 UperNet recipe was published; the Swin UperNet recipe, 8 GPUs x 2
    seg=dict(recipe='Swin UperNet recipe (AdamW 6e-5, wd 0.01, batch 16)',
             optimizer=dict(type='AdamW', lr=6e-5, betas=(0.9, 0.999), weight_decay=0.01)),
    # ADE20K Semantic FPN: the PVT/PVTv2 recipe, 8 GPUs x 2
    fpn=dict(recipe='PVT Semantic FPN recipe (AdamW 1e-4, wd 1e-4, batch 16)',
             optimizer=dict(type='AdamW', lr=1e-4, weight_decay=1e-4)),
    # ImageNet: the official run (PVT/DeiT recipe: AdamW 1e-3 at batch 1024, 5 warmup epochs); the official head
    # averages the normalised last stage
    cls=dict(out_index=3, channels=512, batch_size=1024, warmup_epochs=5, test_resize=256, clip_grad=None,
             recipe='official Shunted ImageNet recipe (AdamW 1e-3, wd 0.05, batch 1024)',
             optimizer=dict(type='AdamW', lr=1e-3, betas=(0.9, 0.999), weight_decay=0.05, eps=1e-8)),
    reported=dict(mask_rcnn_1x='the Shunted paper\'s Mask R-CNN 1x row (COCO)',
                  retinanet_1x='the Shunted paper\'s RetinaNet 1x row (COCO)'))
