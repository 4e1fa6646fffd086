# Cascade Mask R-CNN + ReSwin-T (3x) on your own COCO-format instance data (the layout of
# mask_rcnn_reswin_t_3x_my_coco.py). Its box head is a list of the three cascade stages' heads: set the class count
# in each (a dict here would replace the list by one head).
_base_ = '../cascade_mask_rcnn_reswin_t_3x.py'
classes = ('cat', 'dog')
data_root = 'data/my_coco/'
metainfo = dict(classes=classes)

model = dict(roi_head=dict(
    bbox_head=[dict(head, num_classes=len(classes)) for head in _base_.model.roi_head.bbox_head],
    mask_head=dict(num_classes=len(classes))))
train_dataloader = dict(dataset=dict(data_root=data_root, metainfo=metainfo,
                                     ann_file='annotations/instances_train.json', data_prefix=dict(img='train/')))
val_dataloader = dict(dataset=dict(data_root=data_root, metainfo=metainfo,
                                   ann_file='annotations/instances_val.json', data_prefix=dict(img='val/')))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/instances_val.json')
test_evaluator = val_evaluator
