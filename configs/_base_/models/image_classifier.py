# ImageNet classifier: backbone -> global average pooling -> linear head, the head layout of the official
# classifiers of every mmvisatt family (a converted official checkpoint fills `backbone.*` and `head.fc.*`).
# The task config adds `backbone` (the output the official head pools) and `head.in_channels`.
model = dict(
    type='ImageClassifier',
    neck=dict(type='GlobalAveragePooling'),
    head=dict(
        type='LinearClsHead',
        num_classes=1000,
        # the backbone's init_weights initialises itself; the head follows the model-level rules below
        init_cfg=None,
        loss=dict(type='LabelSmoothLoss', label_smooth_val=0.1, mode='original'),
        cal_acc=False),
    init_cfg=[dict(type='TruncNormal', layer='Linear', std=0.02, bias=0.)],
    train_cfg=dict(augments=[dict(type='Mixup', alpha=0.8), dict(type='CutMix', alpha=1.0)]))
