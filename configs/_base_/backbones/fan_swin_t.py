# FAN-T-Swin (Swin stages of 96-192-384-768 channels, depths 2-2-6-2, channel-attention MLPs).
# What every task config of this backbone shares (over _fan.py; the dense recipes are in mmvisatt/recipes.py).
_base_ = ['./_fan.py']
# FAN-Swin weights were not released: train them with configs/imagenet_fan_swin_t.py and save the result here.
pretrained = 'checkpoints/fan_swin_t_imagenet.pth'
pretrained_source = 'no official weights exist: train configs/imagenet_fan_swin_t.py'
preset = dict(
    name='FAN-T-Swin',
    # SyncBN in the stem / channel attention as the official detection code (BN outside DDP)
    backbone=dict(type='FANSwin', arch='swin_t', norm_cfg=dict(type='SyncBN'),
                  init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    channels=[96, 192, 384, 768],
    no_decay=['norm', 'relative_position_bias_table'],
    cls=dict(channels=768, drop_path_rate=0.3, warmup_epochs=5, optimizer=dict(lr=0.0005),
             recipe='official FAN-T-Swin ImageNet run (AdamW 0.0005, wd 0.05, batch 1024)',
             backbone=dict(out_type='avg_featmap', init_cfg=None)))
