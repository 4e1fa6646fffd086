# RetinaNet with FPN (mmdet 3.x reference settings). The task config adds `backbone` and the neck's
# `in_channels`; feed the FPN only the stages it uses (e.g. out_indices=(1, 2, 3) with start_level=0), or DDP
# stops on parameters that get no gradient.
model = dict(
    type='RetinaNet',
    data_preprocessor=dict(
        type='DetDataPreprocessor',
        mean=[123.675, 116.28, 103.53],
        std=[58.395, 57.12, 57.375],
        bgr_to_rgb=True,
        pad_size_divisor=32),
    neck=dict(type='FPN', out_channels=256, start_level=1, add_extra_convs='on_input', num_outs=5),
    bbox_head=dict(
        # mmdet's RetinaHead with the positive-anchor normaliser averaged over processes, so a run on N GPUs
        # trains like one process with the whole batch; identical to RetinaHead in a single process
        type='SyncAvgRetinaHead',
        num_classes=80,
        in_channels=256,
        stacked_convs=4,
        feat_channels=256,
        anchor_generator=dict(type='AnchorGenerator', octave_base_scale=4, scales_per_octave=3,
                              ratios=[0.5, 1.0, 2.0], strides=[8, 16, 32, 64, 128]),
        bbox_coder=dict(type='DeltaXYWHBBoxCoder', target_means=[.0, .0, .0, .0], target_stds=[1.0, 1.0, 1.0, 1.0]),
        loss_cls=dict(type='FocalLoss', use_sigmoid=True, gamma=2.0, alpha=0.25, loss_weight=1.0),
        loss_bbox=dict(type='L1Loss', loss_weight=1.0)),
    train_cfg=dict(
        assigner=dict(type='MaxIoUAssigner', pos_iou_thr=0.5, neg_iou_thr=0.4, min_pos_iou=0, ignore_iof_thr=-1),
        # focal loss weighs every anchor, so no sampling
        sampler=dict(type='PseudoSampler'),
        allowed_border=-1,
        pos_weight=-1,
        debug=False),
    test_cfg=dict(nms_pre=1000, min_bbox_size=0, score_thr=0.05, nms=dict(type='nms', iou_threshold=0.5),
                  max_per_img=100))
