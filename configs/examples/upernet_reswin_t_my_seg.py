# UperNet + ReSwin-T (the ADE20K recipe) on your own semantic segmentation data. Layout:
#   data/my_seg/images/{training,validation}/*.jpg
#   data/my_seg/annotations/{training,validation}/*.png   (one label per pixel: 0 = ignored background,
#                                                          1..len(classes) = the classes, in that order)
# reduce_zero_label (the recipe's) turns 0 into the ignore index 255 and 1..N into 0..N-1. Semantic FPN:
# the same lines over ../fpn_reswin_t_80k_ade20k.py (its head is decode_head alone).
_base_ = '../upernet_reswin_t_160k_ade20k.py'
classes = ('road', 'grass', 'building')
data_root = 'data/my_seg/'
metainfo = dict(classes=classes, palette=[[128, 64, 128], [0, 192, 0], [70, 70, 70]])

model = dict(decode_head=dict(num_classes=len(classes)), auxiliary_head=dict(num_classes=len(classes)))
train_dataloader = dict(dataset=dict(type='BaseSegDataset', data_root=data_root, metainfo=metainfo,
                                     img_suffix='.jpg', seg_map_suffix='.png', reduce_zero_label=True))
val_dataloader = dict(dataset=dict(type='BaseSegDataset', data_root=data_root, metainfo=metainfo,
                                   img_suffix='.jpg', seg_map_suffix='.png', reduce_zero_label=True))
test_dataloader = val_dataloader
