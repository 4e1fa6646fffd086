# ImageNet-1k classification at 224 (the DeiT/Swin augmentation: bicubic random resized crops, RandAugment,
# random erasing; Mixup/CutMix are batch augments of the model base).
#   data/imagenet/{train,val}/<class folders>/*.JPEG (or meta/{train,val}.txt annotation lists)
dataset_type = 'ImageNet'
data_preprocessor = dict(
    num_classes=1000,
    mean=[123.675, 116.28, 103.53],
    std=[58.395, 57.12, 57.375],
    to_rgb=True)

bgr_mean = data_preprocessor['mean'][::-1]
bgr_std = data_preprocessor['std'][::-1]

train_pipeline = [
    dict(type='LoadCheckedImageFromFile'),
    dict(type='RandomResizedCrop', scale=224, backend='pillow', interpolation='bicubic'),
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    dict(type='RandAugment', policies='timm_increasing', num_policies=2, total_level=10, magnitude_level=9,
         magnitude_std=0.5, hparams=dict(pad_val=[round(x) for x in bgr_mean], interpolation='bicubic')),
    dict(type='RandomErasing', erase_prob=0.25, mode='rand', min_area_ratio=0.02, max_area_ratio=1 / 3,
         fill_color=bgr_mean, fill_std=bgr_std),
    dict(type='PackInputs'),
]
# 224 / 256 = 0.875 centre crop; a task config changes `scale` where the official evaluation used another ratio
test_pipeline = [
    dict(type='LoadCheckedImageFromFile'),
    dict(type='ResizeEdge', scale=256, edge='short', backend='pillow', interpolation='bicubic'),
    dict(type='CenterCrop', crop_size=224),
    dict(type='PackInputs'),
]

# 8 GPUs x 128 images = 1024 (auto_scale_lr in the schedule)
train_dataloader = dict(
    batch_size=128,
    num_workers=8,
    dataset=dict(type=dataset_type, data_root='data/imagenet', split='train', pipeline=train_pipeline),
    sampler=dict(type='DefaultSampler', shuffle=True))
val_dataloader = dict(
    batch_size=64,
    num_workers=8,
    dataset=dict(type=dataset_type, data_root='data/imagenet', split='val', pipeline=test_pipeline),
    sampler=dict(type='DefaultSampler', shuffle=False))
val_evaluator = dict(type='Accuracy', topk=(1, 5))
test_dataloader = val_dataloader
test_evaluator = val_evaluator
