# RMT-L (official RMT_L6: C 112-224-448-640, depths 4-8-25-8): Manhattan spatial-decay self-attention.
# What every task config of this backbone shares (over the official RMT recipes of _rmt.py).
# Official ImageNet weights: Baidu Pan links in the README of https://github.com/qhfan/RMT (plain, EMA or
# token-labelling files all load; the EMA weights are used when present); save the file here.
_base_ = ['./_rmt.py']
pretrained = 'checkpoints/rmt_l.pth'
pretrained_source = 'the RMT-L ImageNet-1k link (Baidu Pan) in the README of https://github.com/qhfan/RMT'
preset = dict(
    name='RMT-L',
    backbone=dict(type='RMT', arch='l', init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    channels=[112, 224, 448, 640],
    drop_path_rate=0.5,
    # the official L configs use lr 2e-4 throughout and 1 image per GPU for Mask R-CNN 3x
    det=dict(recipe='official RMT Mask R-CNN 1x (AdamW 2e-4, wd 0.05, batch 16)',
             optimizer=dict(lr=2e-4)),
    mask_rcnn_3x=dict(batch_size=8, recipe='official RMT Mask R-CNN 3x (AdamW 2e-4, wd 0.05, batch 8)',
                      optimizer=dict(lr=2e-4)),
    cascade_mask_rcnn_3x=dict(recipe='official RMT Cascade Mask R-CNN 3x (AdamW 2e-4, wd 0.05, batch 16)',
                              optimizer=dict(lr=2e-4)),
    retinanet_1x=dict(recipe='official RMT RetinaNet 1x (AdamW 2e-4, wd 1e-4, batch 16)',
                      optimizer=dict(lr=2e-4)),
    cls=dict(neck=dict(in_channels=640)))
