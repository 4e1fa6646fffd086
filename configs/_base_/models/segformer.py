# SegFormer's all-MLP decoder (mmseg 1.x SegformerHead: every level projected to `channels`, upsampled to stride
# 4, fused) for Cityscapes' 19 classes, sliding-window inference on 1024x1024 crops with stride 768 (the FAN
# Cityscapes recipe). The task config adds `backbone` and `decode_head.in_channels`.
norm_cfg = dict(type='SyncBN', requires_grad=True)
model = dict(
    type='EncoderDecoder',
    data_preprocessor=dict(
        type='SegDataPreProcessor',
        mean=[123.675, 116.28, 103.53],
        std=[58.395, 57.12, 57.375],
        bgr_to_rgb=True,
        pad_val=0,
        seg_pad_val=255,
        size=(1024, 1024)),
    decode_head=dict(
        type='SegformerHead',
        in_index=[0, 1, 2, 3],
        channels=768,
        dropout_ratio=0.1,
        num_classes=19,
        norm_cfg=norm_cfg,
        align_corners=False,
        loss_decode=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0)),
    train_cfg=dict(),
    test_cfg=dict(mode='slide', crop_size=(1024, 1024), stride=(768, 768)))
