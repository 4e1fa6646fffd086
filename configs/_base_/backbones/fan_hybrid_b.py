# FAN-B-Hybrid (ConvNeXt stem stages, 448 channels, 16 FAN blocks; the official detection layout).
# What every task config of this backbone shares (over _fan.py; the dense recipes are in mmvisatt/recipes.py).
_base_ = ['./_fan.py']
pretrained_source = ('https://github.com/zhoudaquan/fully_attentional_network_ckpt/releases/download/v1.0.0/'
                     'fan_hybrid_base.pth.tar')
# a direct download: the first run fetches it into torch's hub cache ($TORCH_HOME/hub/checkpoints)
pretrained = pretrained_source
preset = dict(
    name='FAN-B-Hybrid',
    # SyncBN in the stem / channel attention as the official detection code (BN outside DDP)
    backbone=dict(type='FANHybrid', arch='hybrid_b', norm_cfg=dict(type='SyncBN'),
                  init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    channels=[128, 256, 448, 768],
    cls=dict(channels=448, drop_path_rate=0.35, warmup_epochs=10, optimizer=dict(lr=0.004),
             recipe='official FAN-B-Hybrid ImageNet run (AdamW 0.004, wd 0.05, batch 1024)'))
