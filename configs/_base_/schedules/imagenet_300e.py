# 300 epochs, linear warmup then cosine decay to 1e-5 (DeiT / Swin ImageNet recipe). The optimizer belongs to
# the task config; its lr is for a total batch of 1024 (--auto-scale-lr rescales it).
warmup_epochs = 20
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, end=warmup_epochs, convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=True, begin=warmup_epochs)
]
# EpochBasedTrainLoop that resumes a mid-epoch checkpoint at its next batch (mmvisatt.engine.mid_epoch)
train_cfg = dict(type='ResumableEpochBasedTrainLoop', max_epochs=300, val_interval=1)
val_cfg = dict()
test_cfg = dict()
auto_scale_lr = dict(base_batch_size=1024)
