# EVT-L (arXiv 2604.18549): RMT-L's widths and heads (C 112-224-448-640, heads 7-7-14-20), depths 4-8-28-8
# (three more than RMT-L in stage 3, about 100M parameters);
# blocks of CPE + Euclidean self-attention (EuSAg / EuSAd groups of 49 tokens in stages 1-3, full EuSA in stage 4) +
# classic FFN; drop path 0.55 (paper section 4.1). The shape is our reading of the paper's lost Table 5: docs/evt.md.
# What every task config of this backbone shares (over _evt.py; the dense recipes are in mmvisatt/recipes.py).
# No EVT weights were released: train them with configs/imagenet_evt_l.py and save the result here.
_base_ = ['./_evt.py']
pretrained = 'checkpoints/evt_l_imagenet.pth'
pretrained_source = 'no official EVT weights exist: train configs/imagenet_evt_l.py and convert its checkpoint'
preset = dict(
    name='EVT-L',
    backbone=dict(type='EVT', arch='l', init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    channels=[112, 224, 448, 640],
    drop_path_rate=0.55,
    cls=dict(neck=dict(in_channels=640)))
