# ADE20K (SceneParse150) semantic segmentation, 512x512 crops from images resized around 2048x512.
#   data/ade/ADEChallengeData2016/images/{training,validation}/*.jpg
#   data/ade/ADEChallengeData2016/annotations/{training,validation}/*.png
dataset_type = 'ADE20KDataset'
data_root = 'data/ade/ADEChallengeData2016'
crop_size = (512, 512)
train_pipeline = [
    dict(type='LoadCheckedImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='RandomResize', scale=(2048, 512), ratio_range=(0.5, 2.0), keep_ratio=True),
    dict(type='RandomCrop', crop_size=crop_size, cat_max_ratio=0.75),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PhotoMetricDistortion'),
    dict(type='PackSegInputs')
]
test_pipeline = [
    dict(type='LoadCheckedImageFromFile'),
    dict(type='Resize', scale=(2048, 512), keep_ratio=True),
    # after Resize: the metric compares with the label map at its original size
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='PackSegInputs')
]
img_ratios = [0.5, 0.75, 1.0, 1.25, 1.5, 1.75]
tta_pipeline = [
    dict(type='LoadCheckedImageFromFile'),
    dict(
        type='TestTimeAug',
        transforms=[[dict(type='Resize', scale_factor=r, keep_ratio=True) for r in img_ratios],
                    [dict(type='RandomFlip', prob=0., direction='horizontal'),
                     dict(type='RandomFlip', prob=1., direction='horizontal')],
                    [dict(type='LoadAnnotations')], [dict(type='PackSegInputs')]])
]
# The recipes' batch: 8 GPUs x 2 images (the task configs' schedules assume it).
train_dataloader = dict(
    batch_size=2,
    num_workers=4,
    persistent_workers=True,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    dataset=dict(
        type=dataset_type,
        data_root=data_root,
        data_prefix=dict(img_path='images/training', seg_map_path='annotations/training'),
        pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=1,
    num_workers=4,
    persistent_workers=True,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(
        type=dataset_type,
        data_root=data_root,
        data_prefix=dict(img_path='images/validation', seg_map_path='annotations/validation'),
        pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(type='IoUMetric', iou_metrics=['mIoU'])
test_evaluator = val_evaluator
