# FAN-T-Hybrid (ConvNeXt stem stages, 192 channels, 8 FAN blocks; the official detection layout).
# What every task config of this backbone shares (over _fan.py; the dense recipes are in mmvisatt/recipes.py).
_base_ = ['./_fan.py']
pretrained_source = ('https://github.com/zhoudaquan/fully_attentional_network_ckpt/releases/download/v1.0.0/'
                     'fan_hybrid_tiny.pth.tar')
# a direct download: the first run fetches it into torch's hub cache ($TORCH_HOME/hub/checkpoints)
pretrained = pretrained_source
preset = dict(
    name='FAN-T-Hybrid',
    # SyncBN in the stem / channel attention as the official detection code (BN outside DDP)
    backbone=dict(type='FANHybrid', arch='hybrid_t', norm_cfg=dict(type='SyncBN'),
                  init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    channels=[128, 256, 192, 768],
    cls=dict(channels=192, drop_path_rate=0.1, warmup_epochs=5, optimizer=dict(lr=0.001),
             recipe='official FAN-T-Hybrid ImageNet run (AdamW 0.001, wd 0.05, batch 1024)'))
