# EVT-B (arXiv 2604.18549): RMT-B's shape (C 80-160-320-512, depths 4-8-25-8, heads 5-5-10-16);
# blocks of CPE + Euclidean self-attention (EuSAg / EuSAd groups of 49 tokens in stages 1-3, full EuSA in stage 4) +
# classic FFN; drop path 0.4 (paper section 4.1). The shape is our reading of the paper's lost Table 5: docs/evt.md.
# What every task config of this backbone shares (over _evt.py; the dense recipes are in mmvisatt/recipes.py).
# No EVT weights were released: train them with configs/imagenet_evt_b.py and save the result here.
_base_ = ['./_evt.py']
pretrained = 'checkpoints/evt_b_imagenet.pth'
pretrained_source = 'no official EVT weights exist: train configs/imagenet_evt_b.py and convert its checkpoint'
preset = dict(
    name='EVT-B',
    backbone=dict(type='EVT', arch='b', init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    channels=[80, 160, 320, 512],
    drop_path_rate=0.4,
    cls=dict(neck=dict(in_channels=512)))
