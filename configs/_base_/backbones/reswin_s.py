# ReSwin-S: Swin-S (C=96, depths 2-2-18-2, heads 3-6-12-24, window 7) with residual attention (ReViT paper). The paper
# trains only the tiny ReSwin; the S/B presets follow the Swin recipes of the same size.
# What every task config of this backbone shares; the task configs turn it into their model and recipe.
# No ReSwin-S weights were released: initialise from the official Swin-S ImageNet-1k weights (alpha starts
# from its default) saved here.
pretrained = 'checkpoints/swin_small_patch4_window7_224.pth'
pretrained_source = ('https://github.com/SwinTransformer/storage/releases/download/v1.0.0/'
                     'swin_small_patch4_window7_224.pth')
preset = dict(
    name='ReSwin-S',
    backbone=dict(type='ReSwinTransformer', arch='s', residual_mode='aligned',
                  init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    channels=[96, 192, 384, 768],
    # parameters (by name substring) trained without weight decay: norms, position tables, the residual gate
    no_decay=['norm', 'relative_position_bias_table', 'alpha'],
    # COCO: the Swin-S detection recipe (Swin-Transformer-Object-Detection / mmdet swin configs), 8 GPUs x 2
    det=dict(drop_path_rate=0.3, batch_size=16, recipe='Swin-S detection recipe (AdamW 1e-4, wd 0.05, batch 16)',
             optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05)),
    # ADE20K UperNet: the Swin-S UperNet recipe (mmseg swin configs), 8 GPUs x 2
    seg=dict(drop_path_rate=0.3, recipe='Swin-S UperNet recipe (AdamW 6e-5, wd 0.01, batch 16)',
             optimizer=dict(type='AdamW', lr=6e-5, betas=(0.9, 0.999), weight_decay=0.01)),
    # ADE20K Semantic FPN: the PVT/Twins recipe, 8 GPUs x 2
    fpn=dict(drop_path_rate=0.3, recipe='PVT/Twins Semantic FPN recipe (AdamW 1e-4, wd 1e-4, batch 16)',
             optimizer=dict(type='AdamW', lr=1e-4, weight_decay=1e-4)),
    # ImageNet: the Swin-S recipe (lr 1e-3 at batch 1024, 20 warmup epochs, drop path 0.3, 0.875 crop)
    cls=dict(out_index=3, channels=768, drop_path_rate=0.3, batch_size=1024, warmup_epochs=20, test_resize=256,
             clip_grad=dict(max_norm=5.0), recipe='Swin-S ImageNet recipe (AdamW 1e-3, wd 0.05, batch 1024)',
             optimizer=dict(type='AdamW', lr=1e-3, betas=(0.9, 0.999), weight_decay=0.05, eps=1e-8)),
    reported=dict())
