# RMT-T (official RMT_T3: C 64-128-256-512, depths 2-2-8-2): Manhattan spatial-decay self-attention.
# What every task config of this backbone shares (over _rmt.py; the dense recipes are in mmvisatt/recipes.py).
# Official ImageNet weights: Baidu Pan links in the README of https://github.com/qhfan/RMT (plain, EMA or
# token-labelling files all load; the EMA weights are used when present); save the file here.
_base_ = ['./_rmt.py']
pretrained = 'checkpoints/rmt_t.pth'
pretrained_source = 'the RMT-T ImageNet-1k link (Baidu Pan) in the README of https://github.com/qhfan/RMT'
preset = dict(
    name='RMT-T',
    backbone=dict(type='RMT', arch='t', init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    channels=[64, 128, 256, 512],
    drop_path_rate=0.1,
    cls=dict(neck=dict(in_channels=512)))
