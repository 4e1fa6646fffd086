# EVT-L: the RMT-L macro shape with Euclidean spatial decay and 1-D spatially independent token groups
# (EuSAg / EuSAd, 49 tokens), full decayed attention in the last stage. See docs/evt.md.
# What every task config of this backbone shares: EVT published no recipes, so RMT-L's
# (rmt_l.py; dense recipes in mmvisatt/recipes.py) throughout.
# No EVT weights were released: train them with configs/imagenet_evt_l.py and save the result here.
_base_ = ['./rmt_l.py']
pretrained = 'checkpoints/evt_l_imagenet.pth'
pretrained_source = 'no official EVT weights exist: train configs/imagenet_evt_l.py and convert its checkpoint'
preset = dict(
    name='EVT-L',
    backbone=dict(type='EVT', init_cfg=dict(checkpoint=pretrained)),
    # ImageNet from scratch with RMT's recipe and a pool-then-linear head
    cls=dict(channels=640, backbone=dict(_delete_=True, init_cfg=None),
             neck=dict(_delete_=True, type='GlobalAveragePooling'),
             recipe='RMT ImageNet recipe (AdamW 1e-3, wd 0.05, batch 1024)'))
