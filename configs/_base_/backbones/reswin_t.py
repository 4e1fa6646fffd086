# ReSwin-T: Swin-T (C=96, depths 2-2-6-2, heads 3-6-12-24, window 7) with residual attention (ReViT paper).
# What every task config of this backbone shares (over _swin.py; the dense recipes are in mmvisatt/recipes.py).
# Official ImageNet weights: Google Drive only, follow the ReSwin-T link in the README of
# https://github.com/ADiko1997/ReViT and save the file here. Those weights were trained with the official code's
# constant residual mix, so every ReSwin-T config runs residual_mode='official'. The official Swin-T weights also
# work as an init.
_base_ = ['./_swin.py']
pretrained = 'checkpoints/reswin_tiny_patch4_window7_224.pth'
pretrained_source = ('the ReSwin-T link (Google Drive) in the README of https://github.com/ADiko1997/ReViT; the '
                     'official Swin-T file https://github.com/SwinTransformer/storage/releases/download/v1.0.0/'
                     'swin_tiny_patch4_window7_224.pth also works as an init')
# the Google Drive file id of that link (ADiko1997/ReViT@06da93a:Readme.md): `gdown ID -O PATH` fetches it on a
# node without a browser (the pre-flight prints the command when the file is missing)
pretrained_gdown = '14Wronoy-Bm-m9BJwHXgjDYJNTOouj_m5'
preset = dict(
    name='ReSwin-T',
    backbone=dict(type='ReSwinTransformer', arch='t', residual_mode='official',
                  init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    channels=[96, 192, 384, 768],
    # ImageNet: the official ReSwin-T run (base lr 2.5e-4 per 512 images at batch 1024, drop path 0.1, no grad
    # clip, 0.91 centre crop at test); the official head pools the normalised last stage
    cls=dict(_delete_=True, out_index=3, channels=768, drop_path_rate=0.1, batch_size=1024, warmup_epochs=20,
             test_resize=246, clip_grad=None, recipe='official ReSwin-T ImageNet run (AdamW 5e-4, wd 0.05, batch 1024)',
             optimizer=dict(type='AdamW', lr=5e-4, betas=(0.9, 0.999), weight_decay=0.05, eps=1e-8)))
