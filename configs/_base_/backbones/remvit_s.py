# ReMViTv2-S: MViTv2-S (C=96, depths 1-2-11-2) with residual attention (ReViT paper); the paper trains only ReMViTv2-T.
# What every task config of this backbone shares (over _remvit.py).
# No ReMViTv2-S weights were released: initialise from the official MViTv2-S ImageNet-1k weights (alpha starts
# from its default).
_base_ = ['./_remvit.py']
pretrained_source = 'https://dl.fbaipublicfiles.com/mvit/mvitv2_models/MViTv2_S_in1k.pyth'
# a direct download: the first run fetches it into torch's hub cache ($TORCH_HOME/hub/checkpoints)
pretrained = pretrained_source
preset = dict(
    name='ReMViTv2-S',
    backbone=dict(type='ReMViTv2', arch='s', init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    cls=dict(drop_path_rate=0.1))
