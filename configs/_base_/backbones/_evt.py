# What the EVT presets EVT-T/S/B/L share: the paper's ImageNet settings (section 4.1: AdamW, cosine decay, lr 1e-3,
# weight decay 0.05, batch 1024, DeiT's augmentation and EMA), which are the official RMT run's (_rmt.py), and
# RMT's classifier head (projection to 1024 channels, BatchNorm, Swish, pooling): the paper builds EVT on RMT and
# names no other head. A preset inherits this file and adds its backbone, channels and drop path rate.
# EVT published no weights: `init_cfg=None` in the ImageNet config, which trains from scratch.
_base_ = ['./_rmt.py']
preset = dict(
    cls=dict(backbone=dict(init_cfg=None),
             recipe='EVT paper ImageNet settings, section 4.1 (AdamW 1e-3, wd 0.05, batch 1024)'))
