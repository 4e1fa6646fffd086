# EVT-Swin-B (arXiv 2604.18549, sections 3.5 and 4.6): Swin-B (C=128, depths 2-2-18-2, heads 4-8-16-32) with
# window / shifted-window attention replaced by EuSAg / EuSAd (groups of 49 tokens, Euclidean decay) and the last
# stage's attention by full EuSA; no CPE or conv stem. See docs/evt.md.
# What every task config of this backbone shares: the Swin-B recipes (mmvisatt/recipes.py; ImageNet over _swin.py).
# No EVT weights were released: train them with configs/imagenet_evt_swin_b.py and save the result here.
_base_ = ['./_swin.py']
pretrained = 'checkpoints/evt_swin_b_imagenet.pth'
pretrained_source = ('no official EVT weights exist: train configs/imagenet_evt_swin_b.py and convert its '
                     'checkpoint')
preset = dict(
    name='EVT-Swin-B',
    backbone=dict(type='EVT', arch='swin_b', init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    channels=[128, 256, 512, 1024],
    no_decay=['norm'],
    # ImageNet from scratch (no weights to start from), Swin-B's drop path
    cls=dict(channels=1024, drop_path_rate=0.5, backbone=dict(init_cfg=None)))
