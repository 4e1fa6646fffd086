# 80k iterations, poly (power 0.9) decay to 0: the PVT / Twins Semantic FPN recipe (mmseg's own schedule_80k
# stops the decay at 1e-4, which with an lr of 1e-4 would leave it constant). The optimizer belongs to the task
# config.
param_scheduler = [dict(type='PolyLR', eta_min=0.0, power=0.9, begin=0, end=80000, by_epoch=False)]
train_cfg = dict(type='IterBasedTrainLoop', max_iters=80000, val_interval=8000)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
