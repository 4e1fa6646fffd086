# Shunted-S (C 64-128-256-512, depths 2-4-12-1): shunted self-attention, head groups with keys/values
# aggregated at two rates. What every task config of this backbone shares (over _shunted.py).
# Official ImageNet weights (flat state dict ckpt_S.pth): Google Drive / Baidu Pan links in the README of
# https://github.com/OliverRensu/Shunted-Transformer; save the file here.
_base_ = ['./_shunted.py']
pretrained = 'checkpoints/ckpt_S.pth'
pretrained_source = ('the ckpt_S.pth link (Google Drive folder 15iZKXFT7apjUSoN2WUMAbb0tvJgyh3YP or Baidu Pan) in '
                     'the README of https://github.com/OliverRensu/Shunted-Transformer')
preset = dict(
    name='Shunted-S',
    backbone=dict(type='ShuntedTransformer', arch='s', init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    cls=dict(drop_path_rate=0.2))
