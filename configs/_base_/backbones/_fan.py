# What the FAN presets share: the official FAN recipes. A preset inherits this file and adds its backbone,
# channels, pretrained file and ImageNet settings (its `preset` dict merges into this one).
preset = dict(
    no_decay=['norm', 'cls_token'],
    # COCO: the official FAN-Hybrid Cascade Mask R-CNN 3x recipe (AdamW 1e-4, wd 0.05, uniform drop path 0.3,
    # total batch 32 = 32 GPUs x 1), for every detector and form (only the hybrid's was published)
    det=dict(drop_path_rate=0.3, batch_size=32, recipe='official FAN detection recipe (AdamW 1e-4, wd 0.05, batch 32)',
             optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05)),
    # ADE20K UperNet: FAN published only Cityscapes segmentation; its optimizer and drop path, 8 GPUs x 2
    seg=dict(drop_path_rate=0.0, recipe='official FAN segmentation optimizer (AdamW 6e-5, wd 0.01, batch 16)',
             optimizer=dict(type='AdamW', lr=6e-5, betas=(0.9, 0.999), weight_decay=0.01)),
    # ADE20K Semantic FPN: the PVT/Twins recipe, 8 GPUs x 2
    fpn=dict(drop_path_rate=0.1, recipe='PVT/Twins Semantic FPN recipe (AdamW 1e-4, wd 1e-4, batch 16)',
             optimizer=dict(type='AdamW', lr=1e-4, weight_decay=1e-4)),
    # ImageNet: the official run (per-variant lr, warmup and uniform drop path in the presets; total batch 1024 as
    # the README's FAN-T run). The official head: class-attention blocks and a norm on the class token (ViT,
    # Hybrid) or the mean of the normalised last stage (Swin), then linear.
    cls=dict(out_index=3, batch_size=1024, warmup_epochs=5, test_resize=256, clip_grad=None, neck=None,
             backbone=dict(out_type='cls_token', norm_cfg=dict(type='BN')),
             optimizer=dict(type='AdamW', betas=(0.9, 0.999), weight_decay=0.05, eps=1e-8)),
    reported=dict())
