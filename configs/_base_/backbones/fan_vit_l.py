# FAN-L-ViT (480 channels, 24 FAN blocks, conv patch embedding p16; a simple feature pyramid for dense tasks).
# What every task config of this backbone shares (over _fan.py; the dense recipes are in mmvisatt/recipes.py).
_base_ = ['./_fan.py']
# FAN-L-ViT weights were not released: train them with configs/imagenet_fan_vit_l.py and save the result here.
pretrained = 'checkpoints/fan_vit_l_imagenet.pth'
pretrained_source = 'no official weights exist: train configs/imagenet_fan_vit_l.py'
preset = dict(
    name='FAN-L-ViT',
    # SyncBN in the stem / channel attention as the official detection code (BN outside DDP)
    backbone=dict(type='FANViT', arch='vit_l', norm_cfg=dict(type='SyncBN'),
                  init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    channels=[120, 240, 480, 480],
    cls=dict(channels=480, drop_path_rate=0.3, warmup_epochs=5, optimizer=dict(lr=0.001),
             recipe='official FAN-L-ViT ImageNet run (AdamW 0.001, wd 0.05, batch 1024)',
             backbone=dict(init_cfg=None)))
