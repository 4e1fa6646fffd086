"""What the papers and official repositories report for each backbone preset and recipe, with the source of every
number.

Only numbers the official repositories and papers state (each with its source) and the official parameter counts
(the official classifiers built with their
default 1000 classes, head included) are here. Where those notes say a number was not found or is not confirmed
against the paper's text, it is absent: the model zoo shows "not reported", never an estimate.

Units as printed by the source: parameters in millions, FLOPs in G (multiply-adds, the papers' convention).
"""
from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple


@dataclass(frozen=True)
class Reported:
    """One reported row: model size and the metrics the source gives (keys: 'top-1', 'box AP', 'mask AP', 'AP',
    'mIoU')."""
    source: str
    params_m: Optional[float] = None
    gflops: Optional[float] = None
    metrics: Dict[str, float] = field(default_factory=dict)
    note: str = ''


@dataclass(frozen=True)
class OfficialClassifier:
    """The official ImageNet classifier a preset reproduces: its exact parameter count (head included) and, where
    it was measured or computed on the official code, its multiply-adds at 224x224."""
    name: str
    params: Optional[int]
    params_source: str
    gmacs_224: Optional[float] = None
    gmacs_source: str = ''


_REVIT_COUNTS = 'the official ADiko1997/ReViT model built by its own code, 1000 classes'
_FAN_COUNTS = 'the official NVlabs/FAN factory, 1000 classes'
_RMT_COUNTS = 'the official qhfan/RMT classfication_release model, 1000 classes'
_SHUNTED_COUNTS = 'the official OliverRensu/Shunted-Transformer SSA.py factory, 1000 classes'
_FAN_GMACS = 'the official NVlabs/FAN code measured with torch.utils.flop_counter at 224 (FLOPs/2)'
_SHUNTED_GMACS = ('computed on the official Shunted module tree at 224, attention matmuls included')
_RMT_GMACS = ('analytic count on the official qhfan/RMT code at 224 (about 6% above the README; '
              'cause unexplained)')
_EVT_NONE = ('not reported: EVT (arXiv 2604.18549) has no public code, and its parameter table (Table 5) is lost from '
             'the text (arXiv 2604.18549); docs/evt.md gives ours')

OFFICIAL: Dict[str, OfficialClassifier] = {
    'revit_b': OfficialClassifier('ReViT-B', 86566121, _REVIT_COUNTS),
    'remvit_t': OfficialClassifier('ReMViTv2-T', 24173321, _REVIT_COUNTS),
    'reswin_t': OfficialClassifier('ReSwin-T', 28288354, _REVIT_COUNTS),
    'fan_vit_t': OfficialClassifier('fan_tiny_12_p16_224', 7319920, _FAN_COUNTS, 1.56, _FAN_GMACS),
    'fan_vit_s': OfficialClassifier('fan_small_12_p16_224', 28345336, _FAN_COUNTS, 5.64, _FAN_GMACS),
    'fan_vit_b': OfficialClassifier('fan_base_18_p16_224', 54350320, _FAN_COUNTS, 10.97, _FAN_GMACS),
    'fan_vit_l': OfficialClassifier('fan_large_24_p16_224', 80574100, _FAN_COUNTS, 16.40, _FAN_GMACS),
    'fan_hybrid_t': OfficialClassifier('fan_tiny_8_p4_hybrid', 7467240, _FAN_COUNTS, 3.70, _FAN_GMACS),
    'fan_hybrid_s': OfficialClassifier('fan_small_12_p4_hybrid', 26117944, _FAN_COUNTS, 7.13, _FAN_GMACS),
    'fan_hybrid_b': OfficialClassifier('fan_base_16_p4_hybrid', 50475048, _FAN_COUNTS, 12.05, _FAN_GMACS),
    'fan_hybrid_l': OfficialClassifier('fan_large_16_p4_hybrid', 76855140, _FAN_COUNTS, 18.09, _FAN_GMACS),
    'fan_swin_t': OfficialClassifier('fan_swin_tiny_patch4_window7_224', 29538940, _FAN_COUNTS, 4.88, _FAN_GMACS),
    'fan_swin_s': OfficialClassifier('fan_swin_small_patch4_window7_224', 53064220, _FAN_COUNTS, 9.54, _FAN_GMACS),
    'fan_swin_b': OfficialClassifier('fan_swin_base_patch4_window7_224', 93599448, _FAN_COUNTS, 16.78, _FAN_GMACS),
    'fan_swin_l': OfficialClassifier('fan_swin_large_patch4_window7_224', 208941136, _FAN_COUNTS, 37.35,
                                     _FAN_GMACS),
    'rmt_t': OfficialClassifier('RMT_T3', 14334216, _RMT_COUNTS, 2.64, _RMT_GMACS),
    'rmt_s': OfficialClassifier('RMT_S', 26967240, _RMT_COUNTS, 4.78, _RMT_GMACS),
    'rmt_b': OfficialClassifier('RMT_M2', 54154896, _RMT_COUNTS, 10.37, _RMT_GMACS),
    'rmt_l': OfficialClassifier('RMT_L6', 95464864, _RMT_COUNTS, 19.49, _RMT_GMACS),
    'shunted_t': OfficialClassifier('shunted_t', 11553576, _SHUNTED_COUNTS, 2.15, _SHUNTED_GMACS),
    'shunted_s': OfficialClassifier('shunted_s', 22401256, _SHUNTED_COUNTS, 4.99, _SHUNTED_GMACS),
    'shunted_b': OfficialClassifier('shunted_b', 39614376, _SHUNTED_COUNTS, 8.15, _SHUNTED_GMACS),
}

# The official detection backbones (FAN only: the other families released no dense-task backbone with counts):
# token -> (params, official name). The official code has no per-output norms; ours adds one per output.
_FAN_DET = 'the official NVlabs/FAN detection backbones (detection/models/fan.py) built by their own code'
OFFICIAL_DENSE: Dict[str, Tuple[int, str, str]] = {
    'fan_hybrid_t': (8601728, 'fan_tiny_8_p4_hybrid', _FAN_DET),
    'fan_hybrid_s': (28387152, 'fan_small_12_p4_hybrid', _FAN_DET),
    'fan_hybrid_b': (53122496, 'fan_base_12_p4_hybrid', _FAN_DET),
    'fan_hybrid_l': (79691708, 'fan_large_12_p4_hybrid', _FAN_DET),
}

# Presets with no official classifier count, and why (shown in the zoo instead of a number).
NO_OFFICIAL_COUNT: Dict[str, str] = {
    'reswin_s': 'not reported: the ReViT repo releases ReSwin-T only (its README)',
    'reswin_b': 'not reported: the ReViT repo releases ReSwin-T only (its README)',
    'remvit_s': 'not reported: the ReViT repo releases ReMViTv2-T only (its README)',
    'remvit_b': 'not reported: the ReViT repo releases ReMViTv2-T only (its README)',
    'evt_t': _EVT_NONE, 'evt_s': _EVT_NONE, 'evt_b': _EVT_NONE, 'evt_l': _EVT_NONE, 'evt_swin_t': _EVT_NONE,
    'evt_swin_s': _EVT_NONE, 'evt_swin_b': _EVT_NONE,
}

_REVIT_README = 'ReViT README (ADiko1997/ReViT), ImageNet-1k 224'
_FAN_README = 'FAN README (NVlabs/FAN), IN-1K column and #Params'
_RMT_README = 'RMT README (qhfan/RMT), ImageNet-1k 224'
_SHUNTED_README = 'Shunted README (OliverRensu/Shunted-Transformer), ImageNet 224'
_RMT_DET = 'RMT paper Tables 2-4 (image detect/RMT_det.png in qhfan/RMT)'
_RMT_SEG = 'RMT paper Table 5 (image segmentation/seg_res.png in qhfan/RMT)'
_EVT_PAPER = 'EVT paper (arXiv 2604.18549) §{}'
# how sure the mapping from the paper's size name to our preset is (docs/evt.md, "Results the paper reports")
_EVT_MAP = ('the paper\'s number for its model of that name; our shape is our reading of its lost Table 5 '
            '(docs/evt.md), so sizes may differ')
_FAN_COCO = ('FAN README (NVlabs/FAN) detection table, Cascade Mask R-CNN 3x, IN-1K pretrained; the README does not '
             'name the metric (presumably box AP)')


def _top1(source: str, top1: float, params_m: Optional[float] = None, gflops: Optional[float] = None,
          note: str = '') -> Reported:
    return Reported(source, params_m, gflops, {'top-1': top1}, note)


def _maskrcnn(params_m, gflops, box, mask, source=_RMT_DET) -> Reported:
    return Reported(source, params_m, gflops, {'box AP': box, 'mask AP': mask})


REPORTED: Dict[Tuple[str, str], Reported] = {
    # ImageNet-1k
    ('revit_b', 'imagenet'): _top1(_REVIT_README, 82.4, 86, 17.5),
    ('remvit_t', 'imagenet'): _top1(_REVIT_README, 82.7, 24, 4.7),
    ('reswin_t', 'imagenet'): _top1(_REVIT_README, 81.5, 29, 4.5),
    ('fan_vit_t', 'imagenet'): _top1(_FAN_README, 79.2, 7.3),
    ('fan_vit_s', 'imagenet'): _top1(_FAN_README, 82.5, 28.0, note='the first README gave 82.9'),
    ('fan_vit_b', 'imagenet'): _top1(_FAN_README, 83.6, 54.0),
    ('fan_vit_l', 'imagenet'): _top1(_FAN_README, 83.9, 80.5, note='no weights released'),
    ('fan_hybrid_t', 'imagenet'): _top1(_FAN_README, 80.1, 7.4),
    ('fan_hybrid_s', 'imagenet'): _top1(_FAN_README, 83.5, 26.3),
    ('fan_hybrid_b', 'imagenet'): _top1(_FAN_README, 83.9, 50.4),
    ('fan_hybrid_l', 'imagenet'): _top1(_FAN_README, 84.3, 76.8, note='no IN-1K weights released'),
    ('rmt_t', 'imagenet'): _top1(_RMT_README, 82.4, 14, 2.5),
    ('rmt_s', 'imagenet'): _top1(_RMT_README, 84.1, 27, 4.5),
    ('rmt_b', 'imagenet'): _top1(_RMT_README, 85.0, 54, 9.7),
    ('rmt_l', 'imagenet'): _top1(_RMT_README, 85.5, 95, 18.2),
    ('shunted_t', 'imagenet'): _top1(_SHUNTED_README, 79.8, 11.5),
    ('shunted_s', 'imagenet'): _top1(_SHUNTED_README, 82.9, 22.4),
    ('shunted_b', 'imagenet'): _top1(_SHUNTED_README, 84.0, 39.6),
    ('evt_l', 'imagenet'): Reported(
        _EVT_PAPER.format('1, 4.4'), 100, None,
        {'top-1': 86.6, 'ImageNet-A top-1': 55.5, 'ImageNet-R top-1': 56.9},
        note='EVT-L in the paper (named): top-1 at 384x384 (our config evaluates at 224); ImageNet-A 55.5 and '
             'ImageNet-R 56.9 with ImageNet-1k pre-training only'),
    # COCO
    ('rmt_t', 'mask_rcnn_1x'): _maskrcnn(33, 218, 47.1, 42.6),
    ('rmt_s', 'mask_rcnn_1x'): _maskrcnn(46, 262, 49.0, 43.9),
    ('rmt_b', 'mask_rcnn_1x'): _maskrcnn(73, 373, 51.1, 45.5),
    ('rmt_l', 'mask_rcnn_1x'): _maskrcnn(114, 557, 51.6, 45.9),
    ('rmt_s', 'mask_rcnn_3x'): _maskrcnn(None, None, 50.7, 44.9),
    ('rmt_b', 'mask_rcnn_3x'): _maskrcnn(None, None, 52.2, 46.1),
    ('rmt_s', 'cascade_mask_rcnn_3x'): _maskrcnn(83, 741, 53.2, 46.1),
    ('rmt_b', 'cascade_mask_rcnn_3x'): _maskrcnn(111, 852, 54.5, 47.2),
    ('rmt_t', 'retinanet_1x'): Reported(_RMT_DET, 23, 199, {'AP': 45.1}),
    ('rmt_s', 'retinanet_1x'): Reported(_RMT_DET, 36, 244, {'AP': 47.8}),
    ('rmt_b', 'retinanet_1x'): Reported(_RMT_DET, 63, 355, {'AP': 49.1}),
    ('rmt_l', 'retinanet_1x'): Reported(_RMT_DET, 104, 537, {'AP': 49.4}),
    ('fan_hybrid_t', 'cascade_mask_rcnn_3x'): Reported(
        _FAN_COCO, metrics={'box AP': 50.2}, note='the first README and paper Table 10 (secondary) give 45.8'),
    ('fan_hybrid_s', 'cascade_mask_rcnn_3x'): Reported(
        _FAN_COCO, metrics={'box AP': 53.3}, note='the first README and paper Table 10 (secondary) give 49.1'),
    ('fan_hybrid_b', 'cascade_mask_rcnn_3x'): Reported(_FAN_COCO, metrics={'box AP': 54.2}),
    ('fan_hybrid_l', 'cascade_mask_rcnn_3x'): Reported(_FAN_COCO, metrics={'box AP': 55.1}),
    # ADE20K
    ('rmt_t', 'fpn_80k_ade20k'): Reported(_RMT_SEG, 17.0, 33.7, {'mIoU': 46.4},
                                          note='FLOPs at 512x512, not 2048x512 (paper §4.3)'),
    ('rmt_s', 'fpn_80k_ade20k'): Reported(_RMT_SEG, 30, 180, {'mIoU': 49.4}),
    ('rmt_b', 'fpn_80k_ade20k'): Reported(_RMT_SEG, 57, 294, {'mIoU': 50.4}),
    ('rmt_l', 'fpn_80k_ade20k'): Reported(_RMT_SEG, 98, 482, {'mIoU': 51.4}),
    ('rmt_s', 'upernet_160k_ade20k'): Reported(_RMT_SEG, 56, 937, {'mIoU': 49.8},
                                               note='arXiv v6 "fixes the bug in the UperNet": may differ by version'),
    ('rmt_b', 'upernet_160k_ade20k'): Reported(_RMT_SEG, 83, 1051, {'mIoU': 52.0},
                                               note='arXiv v6 "fixes the bug in the UperNet": may differ by version'),
    ('rmt_l', 'upernet_160k_ade20k'): Reported(_RMT_SEG, 125, 1241, {'mIoU': 52.8},
                                               note='arXiv v6 "fixes the bug in the UperNet": may differ by version'),
    ('evt_t', 'fpn_80k_ade20k'): Reported(_EVT_PAPER.format('4.3'), metrics={'mIoU': 48.3}, note=_EVT_MAP),
    ('evt_s', 'fpn_80k_ade20k'): Reported(_EVT_PAPER.format('4.3'), metrics={'mIoU': 50.0}, note=_EVT_MAP),
    ('evt_b', 'fpn_80k_ade20k'): Reported(_EVT_PAPER.format('4.3'), metrics={'mIoU': 51.7}, note=_EVT_MAP),
    ('evt_l', 'fpn_80k_ade20k'): Reported(_EVT_PAPER.format('4.3'), metrics={'mIoU': 52.0}, note=_EVT_MAP),
    ('evt_b', 'upernet_160k_ade20k'): Reported(_EVT_PAPER.format('4.3'), metrics={'mIoU': 52.7}, note=_EVT_MAP),
}

# Why a whole family has no downstream numbers here (shown under the recipe tables).
NOT_REPORTED_WHY: Dict[str, str] = {
    'ReViT family': 'the paper\'s COCO tables for ReSwin-T / ReMViTv2-T were not found; '
                    'no ADE20K numbers are reported',
    'FAN': 'segmentation is reported on Cityscapes only (no ADE20K); detection only for the hybrids with Cascade '
           'Mask R-CNN 3x, without params or FLOPs',
    'RMT': 'the paper has no Mask R-CNN 3x / Cascade rows for RMT-T and RMT-L and no UperNet row for RMT-T '
           '(arXiv 2309.11523 v5, Tables 2-5)',
    'EVT': 'the paper\'s tables are lost from its text: what the text states is here '
           '(ADE20K Semantic FPN for every size, UperNet for EVT-B, EVT-L on ImageNet at 384 and its robustness); '
           'no COCO numbers, no parameter or FLOP counts per size',
    'Shunted': 'the paper\'s COCO / ADE20K tables and FLOPs are not confirmed against the paper\'s text '
               '(arXiv 2111.15193)',
}


# Known reasons for gaps between our counts and the reported ones (shown above the "missing" list).
COMPARISON_NOTES: Dict[str, str] = {
    'RMT': 'the README\'s ImageNet FLOPs are about 6% below an analytic count on the official code, cause '
           'unexplained, and ours equal that analytic count. The reported dense-task '
           'FLOPs are further below ours, more so at higher token counts (RMT-T, whose stage 3 uses full '
           'attention, most): the attention products are what grows faster than the token count, and mmcv\'s FLOP '
           'counter leaves them out (GitHub issue 5 of OliverRensu/Shunted-Transformer), but '
           'which counter the RMT paper used is not documented. Compare parameters first (the classifiers\' are '
           'checked exactly against the official code)',
    'FAN': 'the official detection backbone differs from the classifier (no norm/head, an extra learnable '
           'downsampling to 768 channels for the stride-32 output), so the hybrids\' dense backbones are compared '
           'with the official detection backbones instead; ours adds one output norm per stage. The official '
           'GFLOPs of FAN-ViT / FAN-Hybrid are higher than ours by one (tokens x tokens x channels) product per '
           'block (e.g. 12 x 196^2 x 384 = 0.18G for FAN-S-ViT) because the official `TokenMixing.forward` '
           '(NVlabs/FAN models/fan.py) computes `attn @ v` a second time for a return value its blocks discard; '
           'FAN-Swin, which does not use that class, matches exactly',
    'ReSwin-T': 'the official ReSwin-T mixes attention scores with the constant 0.5 and has no alpha parameter '
                '(ADiko1997/ReViT reswin.py); our ReSwin-T preset runs in that mode (the released weights were trained '
                'in it), so the counts agree; ReSwin-S/B learn alpha, one parameter more',
}


def official_classifier(token: str) -> Optional[OfficialClassifier]:
    return OFFICIAL.get(token)


def reported(token: str, recipe: str) -> Optional[Reported]:
    return REPORTED.get((token, recipe))
