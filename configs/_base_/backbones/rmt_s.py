# RMT-S (official RMT_S: C 64-128-256-512, depths 3-4-18-4): Manhattan spatial-decay self-attention.
# What every task config of this backbone shares (over _rmt.py; the dense recipes are in mmvisatt/recipes.py).
# Official ImageNet weights: Baidu Pan links in the README of https://github.com/qhfan/RMT (plain, EMA or
# token-labelling files all load; the EMA weights are used when present); save the file here.
_base_ = ['./_rmt.py']
pretrained = 'checkpoints/rmt_s.pth'
pretrained_source = 'the RMT-S ImageNet-1k link (Baidu Pan) in the README of https://github.com/qhfan/RMT'
preset = dict(
    name='RMT-S',
    backbone=dict(type='RMT', arch='s', init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    channels=[64, 128, 256, 512],
    drop_path_rate=0.15,
    cls=dict(neck=dict(in_channels=512)))
