# The Swin ImageNet recipe, shared by the presets of Swin-shaped backbones (ReSwin-T/S/B, EVT-Swin-T). A preset
# inherits this file and adds its backbone and channels (its `preset` dict merges into this one). The dense
# recipes (the official Swin detection and mmseg UperNet ones) are in mmvisatt/recipes.py.
preset = dict(
    # parameters (by name substring) trained without weight decay: norms, position tables, the residual gate
    no_decay=['norm', 'relative_position_bias_table', 'alpha'],
    # ImageNet: the Swin recipe (lr 1e-3 at batch 1024, 20 warmup epochs, grad clip 5, 0.875 centre crop)
    cls=dict(out_index=3, batch_size=1024, warmup_epochs=20, test_resize=256, clip_grad=dict(max_norm=5.0),
             recipe='Swin ImageNet recipe (AdamW 1e-3, wd 0.05, batch 1024)',
             optimizer=dict(type='AdamW', lr=1e-3, betas=(0.9, 0.999), weight_decay=0.05, eps=1e-8)))
