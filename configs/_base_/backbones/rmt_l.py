# RMT-L (official RMT_L6: C 112-224-448-640, depths 4-8-25-8): Manhattan spatial-decay self-attention.
# What every task config of this backbone shares (over _rmt.py; the dense recipes are in mmvisatt/recipes.py).
# Official ImageNet weights: Baidu Pan links in the README of https://github.com/qhfan/RMT (plain, EMA or
# token-labelling files all load; the EMA weights are used when present); save the file here.
_base_ = ['./_rmt.py']
pretrained = 'checkpoints/rmt_l.pth'
pretrained_source = 'the RMT-L ImageNet-1k link (Baidu Pan) in the README of https://github.com/qhfan/RMT'
preset = dict(
    name='RMT-L',
    backbone=dict(type='RMT', arch='l', init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    channels=[112, 224, 448, 640],
    drop_path_rate=0.5,
    cls=dict(neck=dict(in_channels=640)))
