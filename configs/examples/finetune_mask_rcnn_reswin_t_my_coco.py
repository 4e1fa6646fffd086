# Fine-tune a trained Mask R-CNN + ReSwin-T (e.g. your COCO run) on your own classes: start from its whole
# detector (load_from), train 12 epochs at a tenth of the learning rate. The backbone, neck, RPN and the class-free
# parts of the heads load; the layers whose size is the class count (the box classifier and the mask logits) do
# not fit the new classes, stay newly initialised, and mmengine's log lists them ("size mismatch").
_base_ = './mask_rcnn_reswin_t_3x_my_coco.py'
load_from = 'work_dirs/mask_rcnn_reswin_t_3x/epoch_36.pth'
model = dict(backbone=dict(init_cfg=None))  # the weights come from load_from
optim_wrapper = dict(optimizer=dict(lr=1e-5))
train_cfg = dict(max_epochs=12, val_interval=1)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=500),
    dict(type='MultiStepLR', begin=0, end=12, by_epoch=True, milestones=[8, 11], gamma=0.1)
]
