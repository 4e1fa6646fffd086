# Mask R-CNN + ReSwin-T (the 3x recipe) on your own COCO-format instance data. Copy it, then change the classes
# and the paths. Layout:
#   data/my_coco/annotations/instances_{train,val}.json   (COCO json; category names = `classes`, in that order)
#   data/my_coco/{train,val}/                               (the images the json files name)
_base_ = '../mask_rcnn_reswin_t_3x.py'
classes = ('cat', 'dog')
data_root = 'data/my_coco/'
metainfo = dict(classes=classes)

# every head that predicts classes
model = dict(roi_head=dict(bbox_head=dict(num_classes=len(classes)), mask_head=dict(num_classes=len(classes))))
train_dataloader = dict(dataset=dict(data_root=data_root, metainfo=metainfo,
                                     ann_file='annotations/instances_train.json', data_prefix=dict(img='train/')))
val_dataloader = dict(dataset=dict(data_root=data_root, metainfo=metainfo,
                                   ann_file='annotations/instances_val.json', data_prefix=dict(img='val/')))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/instances_val.json')
test_evaluator = val_evaluator
