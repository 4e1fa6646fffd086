# EVT-T (arXiv 2604.18549): RMT-T's widths and heads (C 64-128-256-512, heads 4-4-8-16), depths 2-2-10-2
# (two more than RMT-T in stage 3);
# blocks of CPE + Euclidean self-attention (EuSAg / EuSAd groups of 49 tokens in stages 1-3, full EuSA in stage 4) +
# classic FFN; drop path 0.1 (paper section 4.1). The shape is our reading of the paper's lost Table 5: docs/evt.md.
# What every task config of this backbone shares (over _evt.py; the dense recipes are in mmvisatt/recipes.py).
# No EVT weights were released: train them with configs/imagenet_evt_t.py and save the result here.
_base_ = ['./_evt.py']
pretrained = 'checkpoints/evt_t_imagenet.pth'
pretrained_source = 'no official EVT weights exist: train configs/imagenet_evt_t.py and convert its checkpoint'
preset = dict(
    name='EVT-T',
    backbone=dict(type='EVT', arch='t', init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    channels=[64, 128, 256, 512],
    drop_path_rate=0.1,
    cls=dict(neck=dict(in_channels=512)))
