# What the FAN presets share: the official FAN ImageNet recipe. A preset inherits this file and adds its backbone,
# channels, pretrained file and ImageNet settings (its `preset` dict merges into this one). The dense recipes are
# in mmvisatt/recipes.py.
preset = dict(
    # ImageNet: parameters without weight decay
    no_decay=['norm', 'cls_token'],
    # ImageNet: the official run (per-variant lr, warmup and uniform drop path in the presets; total batch 1024 as
    # the README's FAN-T run). The official head: class-attention blocks and a norm on the class token (ViT,
    # Hybrid) or the mean of the normalised last stage (Swin), then linear.
    cls=dict(out_index=3, batch_size=1024, warmup_epochs=5, test_resize=256, clip_grad=None, neck=None,
             backbone=dict(out_type='cls_token', norm_cfg=dict(type='BN')),
             optimizer=dict(type='AdamW', betas=(0.9, 0.999), weight_decay=0.05, eps=1e-8)))
