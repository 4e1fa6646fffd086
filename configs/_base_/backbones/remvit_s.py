# ReMViTv2-S: MViTv2-S (C=96, depths 1-2-11-2) with residual attention (ReViT paper).
# What every task config of this backbone shares; the task configs turn it into their model and recipe.
# No ReMViTv2-S weights were released: initialise from the official MViTv2-S ImageNet-1k weights (alpha starts
# from its default) saved here.
pretrained = 'checkpoints/MViTv2_S_in1k.pyth'
pretrained_source = 'https://dl.fbaipublicfiles.com/mvit/mvitv2_models/MViTv2_S_in1k.pyth'
preset = dict(
    name='ReMViTv2-S',
    backbone=dict(type='ReMViTv2', arch='s', residual_mode='aligned',
                  init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    channels=[96, 192, 384, 768],
    # parameters (by name substring) trained without weight decay: norms, relative position tables, the gate
    no_decay=['norm', 'rel_pos_h', 'rel_pos_w', 'alpha'],
    # COCO: the paper's ReMViTv2-T recipe (AdamW 1.6e-4, wd 0.1 at batch 64, the Detectron2 MViTv2 recipe) with
    # Detectron2's MViTv2-S drop path. 8 GPUs x 8 images; --auto-scale-lr rescales the lr for another batch.
    det=dict(drop_path_rate=0.2, batch_size=64, recipe='ReMViTv2-T paper recipe (AdamW 1.6e-4, wd 0.1, batch 64)',
             optimizer=dict(type='AdamW', lr=1.6e-4, betas=(0.9, 0.999), weight_decay=0.1)),
    # ADE20K UperNet: no ReMViTv2/MViTv2 run was published; the Swin UperNet recipe, 8 GPUs x 2
    seg=dict(drop_path_rate=0.3, recipe='Swin UperNet recipe (AdamW 6e-5, wd 0.01, batch 16)',
             optimizer=dict(type='AdamW', lr=6e-5, betas=(0.9, 0.999), weight_decay=0.01)),
    # ADE20K Semantic FPN: the PVT/Twins recipe, 8 GPUs x 2
    fpn=dict(drop_path_rate=0.3, recipe='PVT/Twins Semantic FPN recipe (AdamW 1e-4, wd 1e-4, batch 16)',
             optimizer=dict(type='AdamW', lr=1e-4, weight_decay=1e-4)),
    # ImageNet: the official MViTv2-S recipe (lr 2e-3 at batch 4096, 70 warmup epochs, drop path 0.1, grad clip 1)
    cls=dict(out_index=3, channels=768, drop_path_rate=0.1, batch_size=4096, warmup_epochs=70, test_resize=256,
             clip_grad=dict(max_norm=1.0), recipe='MViTv2 ImageNet recipe (AdamW 2e-3, wd 0.05, batch 4096)',
             optimizer=dict(type='AdamW', lr=2e-3, betas=(0.9, 0.999), weight_decay=0.05, eps=1e-8)),
    reported=dict())
