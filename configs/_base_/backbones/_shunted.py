# What the Shunted Transformer presets share: channels, the official ImageNet run. A preset inherits this file and
# adds its backbone, pretrained file and ImageNet drop path (its `preset` dict merges into this one). The dense
# recipes (the PVTv2 harness the author points to) are in mmvisatt/recipes.py.
preset = dict(
    channels=[64, 128, 256, 512],
    # ImageNet: no names without weight decay beyond what the template exempts (norms, biases, 1-D parameters)
    no_decay=[],
    # ImageNet: the official run (PVT/DeiT recipe: AdamW 1e-3 at batch 1024, 5 warmup epochs); the official head
    # averages the normalised last stage
    cls=dict(out_index=3, channels=512, batch_size=1024, warmup_epochs=5, test_resize=256, clip_grad=None,
             recipe='official Shunted ImageNet recipe (AdamW 1e-3, wd 0.05, batch 1024)',
             optimizer=dict(type='AdamW', lr=1e-3, betas=(0.9, 0.999), weight_decay=0.05, eps=1e-8)))
