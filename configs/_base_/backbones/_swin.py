# The Swin recipes, shared by the presets of Swin-shaped backbones (ReSwin-T/S/B, EVT-Swin-T). A preset inherits
# this file and adds its backbone, channels and drop path rates (its `preset` dict merges into this one).
preset = dict(
    # parameters (by name substring) trained without weight decay: norms, position tables, the residual gate
    no_decay=['norm', 'relative_position_bias_table', 'alpha'],
    # COCO: the Swin detection recipe (Swin-Transformer-Object-Detection / mmdet swin configs), 8 GPUs x 2
    det=dict(batch_size=16, recipe='Swin detection recipe (AdamW 1e-4, wd 0.05, batch 16)',
             optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05)),
    # ADE20K UperNet: the Swin UperNet recipe (mmseg swin configs; 44.41 mIoU for Swin-T), 8 GPUs x 2
    seg=dict(recipe='Swin UperNet recipe (AdamW 6e-5, wd 0.01, batch 16)',
             optimizer=dict(type='AdamW', lr=6e-5, betas=(0.9, 0.999), weight_decay=0.01)),
    # ADE20K Semantic FPN: the PVT/Twins recipe, 8 GPUs x 2
    fpn=dict(recipe='PVT/Twins Semantic FPN recipe (AdamW 1e-4, wd 1e-4, batch 16)',
             optimizer=dict(type='AdamW', lr=1e-4, weight_decay=1e-4)),
    # ImageNet: the Swin recipe (lr 1e-3 at batch 1024, 20 warmup epochs, grad clip 5, 0.875 centre crop)
    cls=dict(out_index=3, batch_size=1024, warmup_epochs=20, test_resize=256, clip_grad=dict(max_norm=5.0),
             recipe='Swin ImageNet recipe (AdamW 1e-3, wd 0.05, batch 1024)',
             optimizer=dict(type='AdamW', lr=1e-3, betas=(0.9, 0.999), weight_decay=0.05, eps=1e-8)),
    reported=dict())
