# FAN-B-Swin (Swin stages of 128-256-512-1024 channels, depths 2-2-18-2, channel-attention MLPs).
# What every task config of this backbone shares (over _fan.py; the dense recipes are in mmvisatt/recipes.py).
_base_ = ['./_fan.py']
# FAN-Swin weights were not released: train them with configs/imagenet_fan_swin_b.py and save the result here.
pretrained = 'checkpoints/fan_swin_b_imagenet.pth'
pretrained_source = 'no official weights exist: train configs/imagenet_fan_swin_b.py'
preset = dict(
    name='FAN-B-Swin',
    # SyncBN in the stem / channel attention as the official detection code (BN outside DDP)
    backbone=dict(type='FANSwin', arch='swin_b', norm_cfg=dict(type='SyncBN'),
                  init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    channels=[128, 256, 512, 1024],
    no_decay=['norm', 'relative_position_bias_table'],
    cls=dict(channels=1024, drop_path_rate=0.2, warmup_epochs=10, optimizer=dict(lr=0.002),
             recipe='official FAN-B-Swin ImageNet run (AdamW 0.002, wd 0.05, batch 1024)',
             backbone=dict(out_type='avg_featmap', init_cfg=None)))
