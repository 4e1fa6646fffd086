# What the ReMViTv2 presets share: the ImageNet recipe (ReMViTv2-T / MViTv2). A preset inherits this file and adds
# its backbone, pretrained file and drop path rates (its `preset` dict merges into this one). The dense recipes
# (the paper's ReMViTv2-T Mask R-CNN 3x = Detectron2's MViTv2-T) are in mmvisatt/recipes.py.
preset = dict(
    channels=[96, 192, 384, 768],
    # parameters (by name substring) trained without weight decay: norms, relative position tables, the gate
    no_decay=['norm', 'rel_pos_h', 'rel_pos_w', 'alpha'],
    # ImageNet: the official ReMViTv2-T / MViTv2 recipe (lr 2e-3 at batch 4096, 70 warmup epochs, grad clip 1)
    cls=dict(out_index=3, channels=768, batch_size=4096, warmup_epochs=70, test_resize=256,
             clip_grad=dict(max_norm=1.0), recipe='ReMViTv2 / MViTv2 ImageNet recipe (AdamW 2e-3, wd 0.05, batch 4096)',
             optimizer=dict(type='AdamW', lr=2e-3, betas=(0.9, 0.999), weight_decay=0.05, eps=1e-8)))
