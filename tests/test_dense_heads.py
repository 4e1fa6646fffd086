"""SyncAvgRetinaHead: RetinaHead with its normaliser averaged over processes (the 2-process equivalence itself is
tests/test_reliability.py::test_two_processes_batch_1_train_like_one_process_batch_2[retinanet])."""
import torch


HEAD = dict(
    num_classes=3, in_channels=8, feat_channels=8, stacked_convs=1,
    anchor_generator=dict(type='AnchorGenerator', octave_base_scale=4, scales_per_octave=1, ratios=[1.0],
                          strides=[8, 16]),
    bbox_coder=dict(type='DeltaXYWHBBoxCoder', target_means=[.0] * 4, target_stds=[1.0] * 4),
    loss_cls=dict(type='FocalLoss', use_sigmoid=True, gamma=2.0, alpha=0.25, loss_weight=1.0),
    loss_bbox=dict(type='L1Loss', loss_weight=1.0),
    train_cfg=dict(assigner=dict(type='MaxIoUAssigner', pos_iou_thr=0.5, neg_iou_thr=0.4, min_pos_iou=0,
                                 ignore_iof_thr=-1),
                   sampler=dict(type='PseudoSampler'), allowed_border=-1, pos_weight=-1, debug=False))


def _head(kind: str):
    from mmdet.registry import MODELS
    from mmdet.utils import register_all_modules
    from mmengine.config import ConfigDict

    import mmvisatt.models.dense_heads  # noqa: F401
    register_all_modules(init_default_scope=False)
    torch.manual_seed(0)
    return MODELS.build(ConfigDict(type=kind, **HEAD))


def test_single_process_loss_equals_retinahead():
    from mmengine.structures import InstanceData
    from mmengine.registry import DefaultScope
    # the scope another test of this process left behind must not decide where the coders are looked up
    with DefaultScope.overwrite_default_scope('mmdet'):
        ours, theirs = _head('SyncAvgRetinaHead'), _head('RetinaHead')
    assert list(ours.state_dict()) == list(theirs.state_dict())
    ours.load_state_dict(theirs.state_dict())
    torch.manual_seed(1)
    feats = [torch.randn(2, 8, 8, 8), torch.randn(2, 8, 4, 4)]
    gts = [InstanceData(bboxes=torch.tensor([[4., 4., 30., 40.], [20., 10., 60., 60.]]), labels=torch.tensor([0, 2])),
           InstanceData(bboxes=torch.tensor([[0., 0., 16., 16.]]), labels=torch.tensor([1]))]
    metas = [dict(img_shape=(64, 64), pad_shape=(64, 64), batch_input_shape=(64, 64))] * 2
    got = ours.loss_by_feat(*ours(feats), gts, metas)
    want = theirs.loss_by_feat(*theirs(feats), gts, metas)
    for term in ('loss_cls', 'loss_bbox'):
        assert sum(got[term]).item() > 0
        torch.testing.assert_close(sum(got[term]), sum(want[term]), rtol=0, atol=0)
