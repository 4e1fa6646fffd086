# ReMViTv2-T: MViTv2-T (C=96, depths 1-2-5-2, 1 head at stride 4) with residual attention (ReViT paper).
# What every task config of this backbone shares; the task configs turn it into their model and recipe.
# Official ImageNet weights: Google Drive only, follow the ReMViTv2-T link in the README of
# https://github.com/ADiko1997/ReViT and save the file here. The official MViTv2-T weights (.pyth) also work as an
# init (alpha then starts from its default).
pretrained = 'checkpoints/remvitv2_t.pth'
pretrained_source = ('the ReMViTv2-T link (Google Drive) in the README of https://github.com/ADiko1997/ReViT; the '
                     'official https://dl.fbaipublicfiles.com/mvit/mvitv2_models/MViTv2_T_in1k.pyth also works as '
                     'an init')
preset = dict(
    name='ReMViTv2-T',
    backbone=dict(type='ReMViTv2', arch='t', residual_mode='aligned',
                  init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    channels=[96, 192, 384, 768],
    # parameters (by name substring) trained without weight decay: norms, relative position tables, the gate
    no_decay=['norm', 'rel_pos_h', 'rel_pos_w', 'alpha'],
    # COCO: the paper's ReMViTv2-T recipe (AdamW 1.6e-4, wd 0.1 at batch 64, the Detectron2 MViTv2 recipe) with
    # Detectron2's MViTv2-T drop path. 8 GPUs x 8 images; --auto-scale-lr rescales the lr for another batch.
    det=dict(drop_path_rate=0.2, batch_size=64, recipe='ReMViTv2-T paper recipe (AdamW 1.6e-4, wd 0.1, batch 64)',
             optimizer=dict(type='AdamW', lr=1.6e-4, betas=(0.9, 0.999), weight_decay=0.1)),
    # ADE20K UperNet: no ReMViTv2/MViTv2 run was published; the Swin UperNet recipe, 8 GPUs x 2
    seg=dict(drop_path_rate=0.3, recipe='Swin UperNet recipe (AdamW 6e-5, wd 0.01, batch 16)',
             optimizer=dict(type='AdamW', lr=6e-5, betas=(0.9, 0.999), weight_decay=0.01)),
    # ADE20K Semantic FPN: the PVT/Twins recipe, 8 GPUs x 2
    fpn=dict(drop_path_rate=0.3, recipe='PVT/Twins Semantic FPN recipe (AdamW 1e-4, wd 1e-4, batch 16)',
             optimizer=dict(type='AdamW', lr=1e-4, weight_decay=1e-4)),
    # ImageNet: the official ReMViTv2-T run (lr 2e-3 at batch 4096, 70 warmup epochs, drop path 0.1, grad clip 1)
    cls=dict(out_index=3, channels=768, drop_path_rate=0.1, batch_size=4096, warmup_epochs=70, test_resize=256,
             clip_grad=dict(max_norm=1.0), recipe='official ReMViTv2-T ImageNet run (AdamW 2e-3, wd 0.05, batch 4096)',
             optimizer=dict(type='AdamW', lr=2e-3, betas=(0.9, 0.999), weight_decay=0.05, eps=1e-8)),
    reported=dict(mask_rcnn_3x='the ReViT paper\'s ReMViTv2-T detector (Mask R-CNN 3x, COCO)'))
