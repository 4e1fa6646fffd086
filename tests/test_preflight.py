"""The whole-run pre-flight (mmvisatt.engine.preflight) on small generated COCO and ADE-style folders: each mistake
of a custom data set is named before the Runner starts, and what can be legitimate is only a warning."""
import json
import os.path as osp

import numpy as np
import pytest
from mmengine.config import Config
from PIL import Image

from conftest import CONFIGS
from mmvisatt.engine import entrypoints, preflight
from mmvisatt.engine.preflight import AnnotationError
from mmvisatt.engine.preflight import check_dataset_contents, head_num_classes

CLASSES = ('cat', 'dog', 'bird')
MASK_HEADS = ('model.roi_head.bbox_head.num_classes', 'model.roi_head.mask_head.num_classes')


def _polygon(x, y, w, h):
    return [[x, y, x + w, y, x + w, y + h, x, y + h]]


def _ann(i, image=1, cat=1, bbox=(4, 4, 10, 8), crowd=0, segmentation='box'):
    ann = dict(id=i, image_id=image, category_id=cat, bbox=list(bbox), area=bbox[2] * bbox[3], iscrowd=crowd)
    if segmentation == 'box':
        ann['segmentation'] = _polygon(*bbox)
    elif segmentation is not None:
        ann['segmentation'] = segmentation
    return ann


def _coco_folder(root, anns=None, categories=CLASSES, size=(64, 48), file_size=None, name='ann.json'):
    """Two images (``file_size`` on disk, ``size`` in the file) and a COCO file under ``root``."""
    (root / 'images').mkdir(parents=True, exist_ok=True)
    for i in (1, 2):
        Image.new('RGB', file_size or size, (i * 40, 90, 20)).save(root / 'images' / f'{i}.jpg')
    anns = [_ann(1), _ann(2, image=2, cat=2)] if anns is None else anns
    data = dict(images=[dict(id=i, file_name=f'{i}.jpg', width=size[0], height=size[1]) for i in (1, 2)],
                annotations=anns, categories=[dict(id=i + 1, name=n) for i, n in enumerate(categories)])
    (root / name).write_text(json.dumps(data))
    return str(root / name)


def _det_cfg(root, classes=CLASSES, heads=True, config='mask_rcnn_reswin_t_3x.py', loaders=('train', 'val', 'test'),
             **options):
    """A shipped detection config on the folder ``root``; ``classes`` set as metainfo of ``loaders`` and as the heads'
    ``num_classes`` when ``heads``."""
    cfg = Config.fromfile(osp.join(CONFIGS, config))
    for split in ('train', 'val', 'test'):
        dataset = cfg[f'{split}_dataloader'].dataset
        dataset.update(data_root=str(root), ann_file='ann.json', data_prefix=dict(img='images/'))
        if classes and split in loaders:
            dataset.metainfo = dict(classes=classes)
    for evaluator in (cfg.val_evaluator, cfg.test_evaluator):
        evaluator.ann_file = str(root / 'ann.json')
    if classes and heads:
        cfg.merge_from_dict({path: len(classes) for path, _ in head_num_classes(cfg.model)}, allow_list_keys=True)
    cfg.merge_from_dict(options, allow_list_keys=True)
    return cfg


def test_a_consistent_custom_set_passes(tmp_path):
    _coco_folder(tmp_path)
    assert check_dataset_contents(_det_cfg(tmp_path), 'mmdet') == []


def test_heads_left_at_80_classes_are_named_with_the_fix(tmp_path):
    _coco_folder(tmp_path)
    with pytest.raises(AnnotationError) as error:
        check_dataset_contents(_det_cfg(tmp_path, heads=False), 'mmdet')
    text = str(error.value)
    for path in MASK_HEADS:
        assert f'{path}=80' in text and f'{path}=3' in text
    assert 'train_dataloader.dataset has 3 metainfo.classes' in text


def test_heads_of_every_cascade_stage_are_checked(tmp_path):
    cfg = Config.fromfile(osp.join(CONFIGS, 'cascade_mask_rcnn_reswin_t_3x.py'))
    paths = [p for p, _ in head_num_classes(cfg.model)]
    assert {f'model.roi_head.bbox_head.{i}.num_classes' for i in range(3)} <= set(paths)
    assert not any('rpn_head' in p for p in paths)


def test_metainfo_on_the_train_loader_only_is_refused(tmp_path):
    _coco_folder(tmp_path)
    with pytest.raises(AnnotationError, match=r'val_dataloader.dataset does not set metainfo.*80 classes.*'
                                              r'"val_dataloader.dataset.metainfo.classes=\(cat,dog,bird,\)"'):
        check_dataset_contents(_det_cfg(tmp_path, loaders=('train',)), 'mmdet')


def test_the_suggested_classes_option_parses_to_the_classes(tmp_path):
    from mmengine.config import DictAction
    import argparse
    parser = argparse.ArgumentParser()
    parser.add_argument('--cfg-options', nargs='+', action=DictAction)
    options = parser.parse_args(['--cfg-options', 'a.metainfo.classes=(cat,dog,bird,)']).cfg_options
    assert tuple(options['a.metainfo.classes']) == CLASSES


def test_default_classes_with_other_categories_are_refused(tmp_path):
    _coco_folder(tmp_path, categories=('cat', 'dog', 'widget'),
                 anns=[_ann(1), _ann(2, image=2, cat=3)])
    with pytest.raises(AnnotationError, match=r"categories widget that are not among the default classes"):
        check_dataset_contents(_det_cfg(tmp_path, classes=None), 'mmdet')


def test_no_category_matching_the_classes_is_named(tmp_path):
    _coco_folder(tmp_path, categories=('apple', 'pear', 'plum'))
    with pytest.raises(AnnotationError, match='none of its categories .*"need at least one array'):
        check_dataset_contents(_det_cfg(tmp_path), 'mmdet')


def test_training_on_a_subset_of_the_categories_is_a_warning(tmp_path):
    _coco_folder(tmp_path, anns=[_ann(1), _ann(2, image=2, cat=2), _ann(3, image=2, cat=3)])
    warnings = check_dataset_contents(_det_cfg(tmp_path, classes=('cat', 'dog')), 'mmdet')
    assert any('1 annotations of categories bird' in w and 'ignored' in w for w in warnings)


def test_classes_in_another_order_than_the_file_is_a_warning(tmp_path):
    _coco_folder(tmp_path)
    warnings = check_dataset_contents(_det_cfg(tmp_path, classes=('dog', 'cat', 'bird')), 'mmdet')
    assert any('another order' in w and 'cat, dog, bird' in w for w in warnings)


def test_an_evaluator_file_without_a_class_is_refused(tmp_path):
    _coco_folder(tmp_path)
    other = _coco_folder(tmp_path, categories=('cat', 'dog'), anns=[_ann(1)], name='other.json')
    cfg = _det_cfg(tmp_path)
    cfg.val_dataloader.dataset.ann_file = other
    cfg.val_evaluator.ann_file = other
    with pytest.raises(AnnotationError, match=r'val_evaluator.ann_file .*other.json has no category for classes '
                                              r'bird .*IndexError'):
        check_dataset_contents(cfg, 'mmdet')


def test_a_boxes_only_file_with_a_mask_head_is_refused(tmp_path):
    _coco_folder(tmp_path, anns=[_ann(1, segmentation=None), _ann(2, image=2, cat=2, segmentation=None)])
    with pytest.raises(AnnotationError, match=r'2 of 2 annotations have no "segmentation".*KeyError'):
        check_dataset_contents(_det_cfg(tmp_path), 'mmdet')
    assert check_dataset_contents(_det_cfg(tmp_path, config='retinanet_reswin_t_1x.py'), 'mmdet') == []


def test_crowd_only_and_degenerate_boxes(tmp_path):
    _coco_folder(tmp_path, anns=[_ann(1, crowd=1), _ann(2, image=2, crowd=1)])
    with pytest.raises(AnnotationError, match=r'none of its 2 annotations can be trained on \(2 are crowd'):
        check_dataset_contents(_det_cfg(tmp_path), 'mmdet')
    _coco_folder(tmp_path, anns=[_ann(1, bbox=(4, 4, 0, 8)), _ann(2, bbox=(100, 100, 5, 5))])
    with pytest.raises(AnnotationError, match=r'\(0 are crowd regions, 2 have zero area or lie outside'):
        check_dataset_contents(_det_cfg(tmp_path), 'mmdet')
    # a few dropped boxes are a warning; past the documented share (a fifth) training does not start
    _coco_folder(tmp_path, anns=[_ann(i) for i in range(1, 10)] + [_ann(10, image=2, bbox=(70, 4, 5, 5))])
    warnings = check_dataset_contents(_det_cfg(tmp_path), 'mmdet')
    assert any('1 of 10 annotations have zero area or lie outside their image (e.g. id 10)' in w for w in warnings)
    _coco_folder(tmp_path, anns=[_ann(1), _ann(2, image=2, bbox=(70, 4, 5, 5))])
    with pytest.raises(AnnotationError, match=r'1 of 2 annotations have zero area or lie outside their image '
                                              r'\(e.g. id 2\), more than 20%: .*\[x1, y1, x2, y2\]'):
        check_dataset_contents(_det_cfg(tmp_path), 'mmdet')


def test_annotations_of_images_not_in_the_file_are_named_as_such(tmp_path):
    _coco_folder(tmp_path, anns=[_ann(i) for i in range(1, 10)] + [_ann(10, image=7)])
    warnings = check_dataset_contents(_det_cfg(tmp_path), 'mmdet')
    assert any('1 of 10 annotations name an image_id that is not among the file\'s images (e.g. annotation 10 '
               'names image 7)' in w for w in warnings), warnings
    assert not any('zero area' in w for w in warnings)
    _coco_folder(tmp_path, anns=[_ann(1), _ann(2, image=7), _ann(3, image=8)])
    with pytest.raises(AnnotationError, match=r'2 of 3 annotations name an image_id that is not among'):
        check_dataset_contents(_det_cfg(tmp_path), 'mmdet')


def test_polygons_under_three_points(tmp_path):
    short = [[4, 4, 10, 4]]
    _coco_folder(tmp_path, anns=[_ann(1), _ann(2, image=2, segmentation=short)])
    cfg = _det_cfg(tmp_path)
    with pytest.raises(AnnotationError, match=r'1 annotations have polygons of fewer than 3 points \(ids 2\); '
                                              r'pycocotools fails'):
        check_dataset_contents(cfg, 'mmdet')
    warnings = check_dataset_contents(cfg, 'mmdet', ('train_dataloader',))  # training only ignores them
    assert any('fewer than 3 points (e.g. id 2); mmdet ignores' in w for w in warnings)


def test_image_sizes_and_files_are_compared_on_a_sample(tmp_path):
    _coco_folder(tmp_path, size=(64, 48), file_size=(128, 96))
    with pytest.raises(AnnotationError, match=r'says 1.jpg is 64x48, but .*1.jpg is 128x96.*NaN'):
        check_dataset_contents(_det_cfg(tmp_path), 'mmdet')
    _coco_folder(tmp_path)
    (tmp_path / 'images' / '1.jpg').unlink()
    with pytest.raises(AnnotationError, match=r'1 of the 2 images listed in .*ann.json do not exist \(.*1.jpg\).*'
                                              r'data_prefix.img'):
        check_dataset_contents(_det_cfg(tmp_path), 'mmdet')


def test_empty_image_files_are_named(tmp_path):
    _coco_folder(tmp_path)
    (tmp_path / 'images' / '2.jpg').write_bytes(b'')
    with pytest.raises(AnnotationError, match=r'1 image files of train_dataloader.dataset are empty \(0 bytes\): '
                                              r'.*2.jpg'):
        check_dataset_contents(_det_cfg(tmp_path), 'mmdet')
    _ade_folder(tmp_path / 'ade')
    (tmp_path / 'ade' / 'images' / 'training' / '1.jpg').write_bytes(b'')
    with pytest.raises(AnnotationError, match=r'images/training/1.jpg'):
        check_dataset_contents(_seg_cfg(tmp_path / 'ade'), 'mmseg')


def test_an_empty_image_met_while_training_says_where_to_look(tmp_path):
    from mmcv.transforms import LoadImageFromFile

    from mmvisatt.engine.preflight import explain_image_error
    (tmp_path / 'empty.jpg').write_bytes(b'')
    with pytest.raises(Exception) as raw:
        LoadImageFromFile()(dict(img_path=str(tmp_path / 'empty.jpg')))
    explained = explain_image_error(raw.value, [str(tmp_path)])
    assert explained is not None and f'find {tmp_path} -size 0' in str(explained)


def test_the_image_folders_searched_for_an_empty_image_cover_every_library():
    cfg = Config(dict(
        train_dataloader=dict(dataset=dict(data_root='coco/', data_prefix=dict(img='train2017/'))),
        val_dataloader=dict(dataset=dict(type='ConcatDataset', datasets=[
            dict(data_root='ade', data_prefix=dict(img_path='images/validation', seg_map_path='ann')),
            dict(data_root='/abs/imagenet', data_prefix='/elsewhere/val')])),
        test_dataloader=dict(dataset=dict(data_root='only_root'))))
    assert preflight.image_dirs(cfg) == ['/elsewhere/val', 'ade/images/validation', 'coco/train2017/',
                                         'only_root']


def test_an_exif_rotated_image_is_not_a_size_mismatch(tmp_path):
    _coco_folder(tmp_path, size=(48, 64), file_size=(48, 64))
    image = Image.new('RGB', (64, 48))
    exif = image.getexif()
    exif[0x0112] = 6  # rotated 90 degrees: OpenCV loads it as 48x64
    image.save(tmp_path / 'images' / '1.jpg', exif=exif)
    assert check_dataset_contents(_det_cfg(tmp_path), 'mmdet') == []


def test_a_size_filter_that_removes_every_image_is_named(tmp_path):
    _coco_folder(tmp_path)
    with pytest.raises(AnnotationError, match=r'removes every image.*short side of 48.*min_size=48'):
        check_dataset_contents(_det_cfg(tmp_path, **{'train_dataloader.dataset.filter_cfg.min_size': 64}), 'mmdet')


def test_missing_annotation_keys_are_named(tmp_path):
    ann = _ann(1)
    del ann['area']
    _coco_folder(tmp_path, anns=[ann])
    with pytest.raises(AnnotationError, match=r"1 annotations lack 'area'"):
        check_dataset_contents(_det_cfg(tmp_path), 'mmdet')


def test_boxes_written_as_corners_are_refused(tmp_path):
    """[x1, y1, x2, y2] instead of [x, y, w, h]: the polygons (and the image) contradict every box."""
    corners = [_ann(1, bbox=(10, 8, 30, 20), segmentation=_polygon(10, 8, 20, 12)),
               _ann(2, image=2, cat=2, bbox=(20, 15, 50, 40), segmentation=_polygon(20, 15, 30, 25))]
    _coco_folder(tmp_path, anns=corners)
    with pytest.raises(AnnotationError, match=r'2 of 2 boxes .* read as \[x1, y1, x2, y2\].*width = x2 - x1'):
        check_dataset_contents(_det_cfg(tmp_path), 'mmdet')
    # boxes without polygons that reach past the image while their sizes fit it as coordinates
    _coco_folder(tmp_path, anns=[_ann(1, bbox=(30, 20, 50, 40), segmentation=None)])
    with pytest.raises(AnnotationError, match=r'1 of 1 boxes'):
        check_dataset_contents(_det_cfg(tmp_path, config='retinanet_reswin_t_1x.py'), 'mmdet')


def test_an_evaluation_file_without_annotations_is_refused(tmp_path):
    _coco_folder(tmp_path)
    _coco_folder(tmp_path, anns=[], name='val.json')
    cfg = _det_cfg(tmp_path, **{'val_dataloader.dataset.ann_file': 'val.json',
                                'val_evaluator.ann_file': str(tmp_path / 'val.json')})
    with pytest.raises(AnnotationError, match=r'val.json \(val_dataloader.dataset\) has 2 images but no annotations: '
                                              r'COCO evaluation would report -1'):
        check_dataset_contents(cfg, 'mmdet', ('train_dataloader', 'val_dataloader'))


def test_duplicate_image_ids_are_refused(tmp_path):
    path = _coco_folder(tmp_path)
    data = json.loads(open(path).read())
    data['images'][1]['id'] = 1
    open(path, 'w').write(json.dumps(data))
    with pytest.raises(AnnotationError, match=r'1 image ids occur more than once \(e.g. 1\).*Renumber'):
        check_dataset_contents(_det_cfg(tmp_path), 'mmdet')


def test_classes_written_as_a_string_get_the_tuple(tmp_path):
    _coco_folder(tmp_path, anns=[_ann(1), _ann(2, image=2)], categories=('square', ))
    with pytest.raises(AnnotationError) as error:
        check_dataset_contents(_det_cfg(tmp_path, classes='square', heads=False), 'mmdet')
    assert "classes is the string 'square'" in str(error.value)
    assert "classes=('square',) with a trailing comma" in str(error.value)
    assert 'num_classes=6' not in str(error.value)


def test_the_pre_flight_runs_before_the_runner(tmp_path, tiny_det_config):
    _coco_folder(tmp_path)
    options = [f'{s}_dataloader.dataset.{k}={v}' for s in ('train', 'val') for k, v in
               (('data_root', tmp_path), ('ann_file', 'ann.json'), ('data_prefix.img', 'images/'),
                ('metainfo.classes', '(cat,dog,bird,)'))]
    options += [f'val_evaluator.ann_file={tmp_path / "ann.json"}', 'model.backbone.init_cfg=None']
    with pytest.raises(SystemExit) as exit_:
        entrypoints.run_tool(entrypoints.train_main, [tiny_det_config, '--work-dir', str(tmp_path / 'work'),
                                                      '--cfg-options', *options])
    assert 'model.roi_head.bbox_head.num_classes=80' in str(exit_.value.code)
    assert not (tmp_path / 'work').exists() or not any((tmp_path / 'work').rglob('*.pth'))


# ---------------------------------------------------------------------------------------------------------------
# segmentation folders
# ---------------------------------------------------------------------------------------------------------------

def _ade_folder(root, labels=(0, 1, 150), mode='L', map_size=(40, 30), img_suffix='.jpg'):
    for split in ('training', 'validation'):
        (root / 'images' / split).mkdir(parents=True, exist_ok=True)
        (root / 'annotations' / split).mkdir(parents=True, exist_ok=True)
        for i in range(2):
            Image.new('RGB', (40, 30), (9, 90, 200)).save(root / 'images' / split / f'{i}{img_suffix}')
            ids = np.resize(np.array(labels, np.uint8), map_size[::-1])
            label_map = Image.fromarray(ids, 'L').convert(mode) if mode != 'P' else Image.fromarray(ids, 'P')
            label_map.save(root / 'annotations' / split / f'{i}.png')


def _seg_cfg(root):
    cfg = Config.fromfile(osp.join(CONFIGS, 'fpn_reswin_t_80k_ade20k.py'))
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        cfg[loader].dataset.data_root = str(root)
    return cfg


@pytest.mark.parametrize('mode', ['L', 'P'])
def test_good_segmentation_maps_pass(tmp_path, mode):
    _ade_folder(tmp_path, mode=mode)
    assert check_dataset_contents(_seg_cfg(tmp_path), 'mmseg') == []


def test_colour_segmentation_maps_are_refused(tmp_path):
    _ade_folder(tmp_path, mode='RGB')
    with pytest.raises(AnnotationError, match=r'0.png is a RGB colour image; mmseg needs one-channel maps'):
        check_dataset_contents(_seg_cfg(tmp_path), 'mmseg')


def test_label_ids_beyond_num_classes_are_refused(tmp_path):
    _ade_folder(tmp_path, labels=(0, 1, 151, 200))
    with pytest.raises(AnnotationError, match=r'holds class ids 150, 199 after reduce_zero_label.*0..149 for '
                                              r'num_classes=150'):
        check_dataset_contents(_seg_cfg(tmp_path), 'mmseg')


def test_maps_of_another_size_than_their_images_are_refused(tmp_path):
    _ade_folder(tmp_path, map_size=(20, 15))
    with pytest.raises(AnnotationError, match=r'is 20x15, but its image .* is 40x30'):
        check_dataset_contents(_seg_cfg(tmp_path), 'mmseg')


def test_images_with_another_suffix_are_named_with_the_option(tmp_path):
    _ade_folder(tmp_path, img_suffix='.png')
    with pytest.raises(AnnotationError, match=r'no .jpg images but 2 .png files.*need at least one array.*'
                                              r'--cfg-options train_dataloader.dataset.img_suffix=.png'):
        check_dataset_contents(_seg_cfg(tmp_path), 'mmseg')
