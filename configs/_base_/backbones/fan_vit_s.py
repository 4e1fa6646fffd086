# FAN-S-ViT (384 channels, 12 FAN blocks, conv patch embedding p16; a simple feature pyramid for dense tasks).
# What every task config of this backbone shares (over _fan.py; the dense recipes are in mmvisatt/recipes.py).
_base_ = ['./_fan.py']
pretrained_source = ('https://github.com/zhoudaquan/fully_attentional_network_ckpt/releases/download/v1.0.0/'
                     'fan_vit_small.pth.tar')
# a direct download: the first run fetches it into torch's hub cache ($TORCH_HOME/hub/checkpoints)
pretrained = pretrained_source
preset = dict(
    name='FAN-S-ViT',
    # SyncBN in the stem / channel attention as the official detection code (BN outside DDP)
    backbone=dict(type='FANViT', arch='vit_s', norm_cfg=dict(type='SyncBN'),
                  init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    channels=[96, 192, 384, 384],
    cls=dict(channels=384, drop_path_rate=0.2, warmup_epochs=5, optimizer=dict(lr=0.002),
             recipe='official FAN-S-ViT ImageNet run (AdamW 0.002, wd 0.05, batch 1024)'))
