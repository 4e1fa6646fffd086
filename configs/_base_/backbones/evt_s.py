# EVT-S (arXiv 2604.18549): RMT-S's shape (C 64-128-256-512, depths 3-4-18-4, heads 4-4-8-16);
# blocks of CPE + Euclidean self-attention (EuSAg / EuSAd groups of 49 tokens in stages 1-3, full EuSA in stage 4) +
# classic FFN; drop path 0.15 (paper section 4.1). The shape is our reading of the paper's lost Table 5: docs/evt.md.
# What every task config of this backbone shares (over _evt.py; the dense recipes are in mmvisatt/recipes.py).
# No EVT weights were released: train them with configs/imagenet_evt_s.py and save the result here.
_base_ = ['./_evt.py']
pretrained = 'checkpoints/evt_s_imagenet.pth'
pretrained_source = 'no official EVT weights exist: train configs/imagenet_evt_s.py and convert its checkpoint'
preset = dict(
    name='EVT-S',
    backbone=dict(type='EVT', arch='s', init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    channels=[64, 128, 256, 512],
    drop_path_rate=0.15,
    cls=dict(neck=dict(in_channels=512)))
