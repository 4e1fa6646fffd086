# ReViT-B: ViT-B/16 (C=768, 12 blocks, 12 heads, mean pooling, no class token) with residual attention (ReViT
# paper). Dense tasks read a ViTDet simple feature pyramid (strides 4/8/16/32) built from its stride-16 map.
# What every task config of this backbone shares; the task configs turn it into their model and recipe.
# Official ImageNet weights: Google Drive only, follow the ReViT-B link in the README of
# https://github.com/ADiko1997/ReViT and save the file here. timm's vit_base_patch16_224 weights also work as an
# init (class token dropped, alpha starts from its default).
pretrained = 'checkpoints/revit_b.pth'
pretrained_source = ('the ReViT-B link (Google Drive) in the README of https://github.com/ADiko1997/ReViT; timm '
                     'vit_base_patch16_224 weights also work as an init')
# the Google Drive file id of that link (ADiko1997/ReViT@06da93a:Readme.md): `gdown ID -O PATH` fetches it on a
# node without a browser (the pre-flight prints the command when the file is missing)
pretrained_gdown = '1U8-a3yw1HPcPscm6eTiROxyJJlwfzy6h'
preset = dict(
    name='ReViT-B',
    backbone=dict(type='ReViT', arch='b', init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    channels=[192, 384, 768, 768],
    # parameters (by name substring) trained without weight decay: norms, the position embedding, the gate
    no_decay=['norm', 'pos_embed', 'alpha'],
    # ImageNet: the official ReViT-B run (torch Adam with L2 weight decay 0.3, lr 1e-3 at batch 8192, 30 warmup
    # epochs, drop path 0.2); the official head pools the normalised stride-16 map (output index 2)
    cls=dict(out_index=2, channels=768, drop_path_rate=0.2, batch_size=8192, warmup_epochs=30, test_resize=256,
             clip_grad=None, recipe='official ReViT-B ImageNet run (Adam 1e-3, wd 0.3, batch 8192)',
             optimizer=dict(type='Adam', lr=1e-3, betas=(0.9, 0.999), weight_decay=0.3)))
