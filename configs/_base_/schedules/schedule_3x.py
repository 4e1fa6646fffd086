# 36 epochs, lr x0.1 after epochs 27 and 33, 500-iteration linear warmup (the official 3x recipes of RMT, FAN,
# PVTv2 and Swin).
# The optimizer belongs to the task config: transformer recipes each set their own.
max_epochs = 36
# EpochBasedTrainLoop that resumes a mid-epoch checkpoint at its next batch (mmvisatt.engine.mid_epoch)
train_cfg = dict(type='ResumableEpochBasedTrainLoop', max_epochs=max_epochs, val_interval=1)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')

param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=500),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[27, 33], gamma=0.1)
]

# The recipes' batch: 8 GPUs x 2 images. --auto-scale-lr rescales the lr for another total batch.
auto_scale_lr = dict(enable=False, base_batch_size=16)
