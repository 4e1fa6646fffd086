# ReSwin-B: Swin-B (C=128, depths 2-2-18-2, heads 4-8-16-32, window 7) with residual attention (ReViT paper). The paper
# trains only ReSwin-T; its dense configs borrow the Swin-T recipes (mmvisatt/recipes.py).
# No ReSwin-B weights were released: initialise from the official Swin-B ImageNet-1k weights (alpha starts from
# its default).
_base_ = ['./_swin.py']
pretrained_source = ('https://github.com/SwinTransformer/storage/releases/download/v1.0.0/'
                     'swin_base_patch4_window7_224.pth')
# a direct download: the first run fetches it into torch's hub cache ($TORCH_HOME/hub/checkpoints)
pretrained = pretrained_source
preset = dict(
    name='ReSwin-B',
    backbone=dict(type='ReSwinTransformer', arch='b', residual_mode='aligned',
                  init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    channels=[128, 256, 512, 1024],
    cls=dict(channels=1024, drop_path_rate=0.5))
