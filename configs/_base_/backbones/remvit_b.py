# ReMViTv2-B: MViTv2-B (C=96, depths 2-3-16-3) with residual attention (ReViT paper); the paper trains only ReMViTv2-T.
# What every task config of this backbone shares (over _remvit.py).
# No ReMViTv2-B weights were released: initialise from the official MViTv2-B ImageNet-1k weights (alpha starts
# from its default).
_base_ = ['./_remvit.py']
pretrained_source = 'https://dl.fbaipublicfiles.com/mvit/mvitv2_models/MViTv2_B_in1k.pyth'
# a direct download: the first run fetches it into torch's hub cache ($TORCH_HOME/hub/checkpoints)
pretrained = pretrained_source
preset = dict(
    name='ReMViTv2-B',
    backbone=dict(type='ReMViTv2', arch='b', init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    cls=dict(drop_path_rate=0.3))
