# FAN-L-Hybrid (ConvNeXt stem stages, 480 channels, 22 FAN blocks; the official detection layout).
# What every task config of this backbone shares (over _fan.py; the dense recipes are in mmvisatt/recipes.py).
_base_ = ['./_fan.py']
# FAN-L-Hybrid has no ImageNet-1k release (official issue #18): the ImageNet-22k -> 1k fine-tuned file
# is the official starting point.
pretrained_source = ('https://github.com/zhoudaquan/fully_attentional_network_ckpt/releases/download/v1.0.0/'
                     'fan_hybrid_large_in22k_1k.pth.tar')
# a direct download: the first run fetches it into torch's hub cache ($TORCH_HOME/hub/checkpoints)
pretrained = pretrained_source
preset = dict(
    name='FAN-L-Hybrid',
    # SyncBN in the stem / channel attention as the official detection code (BN outside DDP)
    backbone=dict(type='FANHybrid', arch='hybrid_l', norm_cfg=dict(type='SyncBN'),
                  init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    channels=[128, 256, 480, 768],
    cls=dict(channels=480, drop_path_rate=0.45, warmup_epochs=10, optimizer=dict(lr=0.004),
             recipe='official FAN-L-Hybrid ImageNet run (AdamW 0.004, wd 0.05, batch 1024)'))
