# What the ReMViTv2 presets share: the paper's ReMViTv2-T recipes and the MViTv2 ones. A preset inherits this
# file and adds its backbone, pretrained file and drop path rates (its `preset` dict merges into this one).
preset = dict(
    channels=[96, 192, 384, 768],
    # parameters (by name substring) trained without weight decay: norms, relative position tables, the gate
    no_decay=['norm', 'rel_pos_h', 'rel_pos_w', 'alpha'],
    # COCO: the paper's ReMViTv2-T recipe (AdamW 1.6e-4, wd 0.1 at batch 64: the Detectron2 MViTv2 recipe), with
    # Detectron2's MViTv2 drop path of the size. 8 GPUs x 8 images; --auto-scale-lr rescales the lr for another
    # batch.
    det=dict(batch_size=64, recipe='ReMViTv2-T paper recipe (AdamW 1.6e-4, wd 0.1, batch 64)',
             optimizer=dict(type='AdamW', lr=1.6e-4, betas=(0.9, 0.999), weight_decay=0.1)),
    # ADE20K UperNet: no ReMViTv2/MViTv2 run was published; the Swin UperNet recipe, 8 GPUs x 2
    seg=dict(drop_path_rate=0.3, recipe='Swin UperNet recipe (AdamW 6e-5, wd 0.01, batch 16)',
             optimizer=dict(type='AdamW', lr=6e-5, betas=(0.9, 0.999), weight_decay=0.01)),
    # ADE20K Semantic FPN: the PVT/Twins recipe, 8 GPUs x 2
    fpn=dict(drop_path_rate=0.3, recipe='PVT/Twins Semantic FPN recipe (AdamW 1e-4, wd 1e-4, batch 16)',
             optimizer=dict(type='AdamW', lr=1e-4, weight_decay=1e-4)),
    # ImageNet: the official ReMViTv2-T / MViTv2 recipe (lr 2e-3 at batch 4096, 70 warmup epochs, grad clip 1)
    cls=dict(out_index=3, channels=768, batch_size=4096, warmup_epochs=70, test_resize=256,
             clip_grad=dict(max_norm=1.0), recipe='ReMViTv2 / MViTv2 ImageNet recipe (AdamW 2e-3, wd 0.05, batch 4096)',
             optimizer=dict(type='AdamW', lr=2e-3, betas=(0.9, 0.999), weight_decay=0.05, eps=1e-8)),
    reported=dict())
