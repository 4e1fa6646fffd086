# What the RMT presets share (and, as EVT published none, the EVT presets): the official ImageNet recipe. A preset
# inherits this file and adds its backbone, channels and drop path rate (its `preset` dict merges into this one).
# The dense recipes (detection, segmentation) are in mmvisatt/recipes.py.
preset = dict(
    # ImageNet: norms without weight decay
    no_decay=['norm'],
    # ImageNet: the official DeiT-style run (AdamW 1e-3 at batch 1024, 5 warmup epochs; EMA not reproduced). The
    # official head projects the raw last stage to 1024 channels (BatchNorm, Swish) before pooling.
    cls=dict(out_index=3, channels=1024, batch_size=1024, warmup_epochs=5, test_resize=256, clip_grad=None,
             recipe='official RMT ImageNet run (AdamW 1e-3, wd 0.05, batch 1024)',
             backbone=dict(out_norms=False), neck=dict(type='RMTProjectionNeck', projection=1024),
             optimizer=dict(type='AdamW', lr=1e-3, betas=(0.9, 0.999), weight_decay=0.05, eps=1e-8)))
