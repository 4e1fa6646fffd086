# RetinaNet + ReSwin-T (1x) on your own COCO-format data (boxes only; the layout of the Mask R-CNN example).
_base_ = '../retinanet_reswin_t_1x.py'
classes = ('cat', 'dog')
data_root = 'data/my_coco/'
metainfo = dict(classes=classes)

model = dict(bbox_head=dict(num_classes=len(classes)))
train_dataloader = dict(dataset=dict(data_root=data_root, metainfo=metainfo,
                                     ann_file='annotations/instances_train.json', data_prefix=dict(img='train/')))
val_dataloader = dict(dataset=dict(data_root=data_root, metainfo=metainfo,
                                   ann_file='annotations/instances_val.json', data_prefix=dict(img='val/')))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/instances_val.json')
test_evaluator = val_evaluator
