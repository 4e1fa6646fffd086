# Cityscapes semantic segmentation (19 classes), 1024x1024 crops from images resized around 2048x1024 (the FAN /
# SegFormer Cityscapes pipeline).
#   data/cityscapes/leftImg8bit/{train,val}/<city>/*_leftImg8bit.png
#   data/cityscapes/gtFine/{train,val}/<city>/*_gtFine_labelTrainIds.png (tools/dataset_converters/cityscapes.py
#   of mmsegmentation writes them from the gtFine polygons)
dataset_type = 'CityscapesDataset'
data_root = 'data/cityscapes'
crop_size = (1024, 1024)
train_pipeline = [
    dict(type='LoadCheckedImageFromFile'),
    dict(type='LoadAnnotations'),
    dict(type='RandomResize', scale=(2048, 1024), ratio_range=(0.5, 2.0), keep_ratio=True),
    dict(type='RandomCrop', crop_size=crop_size, cat_max_ratio=0.75),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PhotoMetricDistortion'),
    dict(type='PackSegInputs')
]
test_pipeline = [
    dict(type='LoadCheckedImageFromFile'),
    dict(type='Resize', scale=(2048, 1024), keep_ratio=True),
    # after Resize: the metric compares with the label map at its original size
    dict(type='LoadAnnotations'),
    dict(type='PackSegInputs')
]
# The FAN recipe's batch: 8 GPUs x 1 image.
train_dataloader = dict(
    batch_size=1,
    num_workers=4,
    persistent_workers=True,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    dataset=dict(
        type=dataset_type,
        data_root=data_root,
        data_prefix=dict(img_path='leftImg8bit/train', seg_map_path='gtFine/train'),
        pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=1,
    num_workers=4,
    persistent_workers=True,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(
        type=dataset_type,
        data_root=data_root,
        data_prefix=dict(img_path='leftImg8bit/val', seg_map_path='gtFine/val'),
        pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(type='IoUMetric', iou_metrics=['mIoU'])
test_evaluator = val_evaluator
