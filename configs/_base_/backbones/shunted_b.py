# Shunted-B (C 64-128-256-512, depths 3-4-24-2): shunted self-attention, head groups with keys/values
# aggregated at two rates. What every task config of this backbone shares (over _shunted.py).
# Official ImageNet weights (flat state dict ckpt_B.pth): Google Drive / Baidu Pan links in the README of
# https://github.com/OliverRensu/Shunted-Transformer; save the file here.
_base_ = ['./_shunted.py']
pretrained = 'checkpoints/ckpt_B.pth'
pretrained_source = ('the ckpt_B.pth link (Google Drive folder 15iZKXFT7apjUSoN2WUMAbb0tvJgyh3YP or Baidu Pan) in '
                     'the README of https://github.com/OliverRensu/Shunted-Transformer')
preset = dict(
    name='Shunted-B',
    backbone=dict(type='ShuntedTransformer', arch='b', init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    cls=dict(drop_path_rate=0.3))
