# ReMViTv2-T: MViTv2-T (C=96, depths 1-2-5-2, 1 head at stride 4) with residual attention (ReViT paper).
# What every task config of this backbone shares (over _remvit.py).
# Official ImageNet weights: Google Drive only, follow the ReMViTv2-T link in the README of
# https://github.com/ADiko1997/ReViT and save the file here. The official MViTv2-T weights (.pyth) also work as an
# init (alpha then starts from its default).
_base_ = ['./_remvit.py']
pretrained = 'checkpoints/remvitv2_t.pth'
pretrained_source = ('the ReMViTv2-T link (Google Drive) in the README of https://github.com/ADiko1997/ReViT; the '
                     'official https://dl.fbaipublicfiles.com/mvit/mvitv2_models/MViTv2_T_in1k.pyth also works as '
                     'an init')
# the Google Drive file id of that link (ADiko1997/ReViT@06da93a:Readme.md): `gdown ID -O PATH` fetches it on a
# node without a browser (the pre-flight prints the command when the file is missing)
pretrained_gdown = '1cBUzW7wJ1GUpd1CEgL_cSGd26b4s7U4d'
preset = dict(
    name='ReMViTv2-T',
    backbone=dict(type='ReMViTv2', arch='t', init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    cls=dict(drop_path_rate=0.1))
