# Shunted-T (C 64-128-256-512, depths 1-2-4-1): shunted self-attention, head groups with keys/values
# aggregated at two rates. What every task config of this backbone shares (over _shunted.py).
# Official ImageNet weights (flat state dict ckpt_T.pth): Google Drive / Baidu Pan links in the README of
# https://github.com/OliverRensu/Shunted-Transformer; save the file here.
_base_ = ['./_shunted.py']
pretrained = 'checkpoints/ckpt_T.pth'
pretrained_source = ('the ckpt_T.pth link (Google Drive folder 15iZKXFT7apjUSoN2WUMAbb0tvJgyh3YP or Baidu Pan) in '
                     'the README of https://github.com/OliverRensu/Shunted-Transformer')
preset = dict(
    name='Shunted-T',
    backbone=dict(type='ShuntedTransformer', arch='t', init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    cls=dict(drop_path_rate=0.1))
