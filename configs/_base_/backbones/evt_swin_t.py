# EVT-Swin-T (arXiv 2604.18549, sections 3.5 and 4.6): Swin-T (C=96, depths 2-2-6-2, heads 3-6-12-24) with window /
# shifted-window attention replaced by EuSAg / EuSAd (groups of 49 tokens, Euclidean decay) and the last stage's
# attention by full EuSA; no CPE or conv stem. See docs/evt.md.
# What every task config of this backbone shares: the Swin-T recipes (mmvisatt/recipes.py; ImageNet over _swin.py).
# No EVT weights were released: train them with configs/imagenet_evt_swin_t.py and save the result here.
_base_ = ['./_swin.py']
pretrained = 'checkpoints/evt_swin_t_imagenet.pth'
pretrained_source = ('no official EVT weights exist: train configs/imagenet_evt_swin_t.py and convert its '
                     'checkpoint')
preset = dict(
    name='EVT-Swin-T',
    backbone=dict(type='EVT', arch='swin_t', init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    channels=[96, 192, 384, 768],
    no_decay=['norm'],
    # ImageNet from scratch (no weights to start from), Swin-T's drop path
    cls=dict(channels=768, drop_path_rate=0.2, backbone=dict(init_cfg=None)))
