# ReMViTv2-B: MViTv2-B (C=96, depths 2-3-16-3) with residual attention (ReViT paper); the paper trains only ReMViTv2-T.
# What every task config of this backbone shares (over _remvit.py).
# No ReMViTv2-B weights were released: initialise from the official MViTv2-B ImageNet-1k weights (alpha starts
# from its default) saved here.
# handoff=True: blocks hand their scores on already shrunk instead of keeping their maps, which cuts the
# training peak at detection sizes (docs/performance.md); the values are the map path's.
_base_ = ['./_remvit.py']
pretrained = 'checkpoints/MViTv2_B_in1k.pyth'
pretrained_source = 'https://dl.fbaipublicfiles.com/mvit/mvitv2_models/MViTv2_B_in1k.pyth'
preset = dict(
    name='ReMViTv2-B',
    backbone=dict(type='ReMViTv2', arch='b', residual_mode='aligned', handoff=True,
                  init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    cls=dict(drop_path_rate=0.3))
