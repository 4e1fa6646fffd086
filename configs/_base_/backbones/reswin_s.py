# ReSwin-S: Swin-S (C=96, depths 2-2-18-2, heads 3-6-12-24, window 7) with residual attention (ReViT paper). The paper
# trains only ReSwin-T; its dense configs borrow the Swin-T recipes (mmvisatt/recipes.py).
# No ReSwin-S weights were released: initialise from the official Swin-S ImageNet-1k weights (alpha starts from
# its default).
_base_ = ['./_swin.py']
pretrained_source = ('https://github.com/SwinTransformer/storage/releases/download/v1.0.0/'
                     'swin_small_patch4_window7_224.pth')
# a direct download: the first run fetches it into torch's hub cache ($TORCH_HOME/hub/checkpoints)
pretrained = pretrained_source
preset = dict(
    name='ReSwin-S',
    backbone=dict(type='ReSwinTransformer', arch='s', residual_mode='aligned',
                  init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    channels=[96, 192, 384, 768],
    cls=dict(channels=768, drop_path_rate=0.3))
