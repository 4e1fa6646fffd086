# ReMViTv2-B: MViTv2-B (C=96, depths 2-3-16-3) with residual attention (ReViT paper); the paper trains only ReMViTv2-T.
# What every task config of this backbone shares (over _remvit.py).
# No ReMViTv2-B weights were released: initialise from the official MViTv2-B ImageNet-1k weights (alpha starts
# from its default) saved here.
_base_ = ['./_remvit.py']
pretrained = 'checkpoints/MViTv2_B_in1k.pyth'
pretrained_source = 'https://dl.fbaipublicfiles.com/mvit/mvitv2_models/MViTv2_B_in1k.pyth'
preset = dict(
    name='ReMViTv2-B',
    backbone=dict(type='ReMViTv2', arch='b', residual_mode='aligned',
                  init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    cls=dict(drop_path_rate=0.3))
