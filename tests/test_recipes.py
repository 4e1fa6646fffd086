"""The recipe table pins the dense configs, and the official values pin the table.

Every dense config is loaded (``_base_`` merged, as a user's run sees it) and its effective optimizer, parameter-wise
rules, drop path, schedule, warmup, batch layout, AMP and backbone settings must equal its entry in
``mmvisatt/recipes.py``. The official entries must also equal the values below, transcribed by hand from the official
files (``docs/recipes.md`` names the lines): a change that drifts from an official recipe fails here, whichever of
the table, the templates or the ``_base_`` files it touches.
"""
import glob
import os.path as osp

import pytest
from mmengine.config import Config

from conftest import CONFIGS
from mmvisatt.engine import entrypoints
from mmvisatt.engine.entrypoints import resolve_amp
from mmvisatt.recipes import DENSE_RECIPES, GPUS, SCHEDULES, recipe_for
from mmvisatt.task_configs import RECIPES, backbone_tokens, recipe_key

DENSE = [(r.name.format(bb=t), t, recipe_key(r)) for t in backbone_tokens(CONFIGS) for r in RECIPES
         if r.task != 'cls' and r.applies_to(t)]
SWIN_KEYS = {'absolute_pos_embed', 'relative_position_bias_table', 'norm'}
SYNC_BN = dict(type='SyncBN')


def _official():
    """config name -> the official file's values (lr, wd, betas given?, no-decay keys, norm_decay_mult, drop path,
    warmup iterations and start factor, poly min lr, total batch, AMP, backbone settings)."""
    rows = {}

    def row(name, lr, wd, keys, dp, total=16, amp=None, warmup=(500, 1e-3), betas=True, norm_mult=None,
            min_lr=0., lr_mult=None, **backbone):
        rows[name] = dict(lr=lr, wd=wd, betas=betas, keys=set(keys), norm_mult=norm_mult, dp=dp, warmup=warmup,
                          min_lr=min_lr, total=total, amp=amp, lr_mult=lr_mult or {}, backbone=backbone)

    rmt_dp = dict(t=0.1, s=0.15, b=0.4, l=0.5)
    for size, dp in rmt_dp.items():
        # qhfan/RMT@32ea214 detect/configs/RMT and segmentation/configs/RMT
        row(f'mask_rcnn_rmt_{size}_1x', 2e-4 if size == 'l' else 4e-4, 0.05, SWIN_KEYS, dp, amp='dynamic',
            norm_cfg=SYNC_BN)
        row(f'retinanet_rmt_{size}_1x', 2e-4 if size == 'l' else 4e-4, 1e-4, (), dp, amp=512., betas=False,
            norm_cfg=SYNC_BN)
        row(f'fpn_rmt_{size}_80k_ade20k', 1e-4, 1e-4, (), dp, warmup=None, betas=False, min_lr=1e-6,
            norm_cfg=SYNC_BN)
    for size in 'sbl':
        row(f'mask_rcnn_rmt_{size}_3x', 4e-4 if size == 's' else 2e-4, 0.05, SWIN_KEYS, rmt_dp[size],
            total=8 if size == 'l' else 16, amp='dynamic', norm_cfg=SYNC_BN)
        row(f'upernet_rmt_{size}_160k_ade20k', 6e-5, 0.01, SWIN_KEYS, rmt_dp[size], amp=512., warmup=(1500, 1e-6),
            norm_cfg=SYNC_BN)
    for size in 'sb':
        row(f'cascade_mask_rcnn_rmt_{size}_3x', 4e-4 if size == 's' else 2e-4, 0.05, SWIN_KEYS | {'rpe_table'},
            rmt_dp[size], amp='dynamic', norm_mult=0., norm_cfg=SYNC_BN)
    for size in 'tsbl':
        # NVlabs/FAN@ee1b7df detection/configs/cascade_mask_fan_*_fpn_3x_mstrain_fp16.py: 1 image x 32 GPUs
        row(f'cascade_mask_rcnn_fan_hybrid_{size}_3x', 1e-4, 0.05, SWIN_KEYS, 0.3, total=32, amp='dynamic',
            norm_cfg=SYNC_BN, out_norms=False, pos_exponent='linear')
        # segmentation/local_configs/fan/fan_hybrid/*.1024x1024.city.160k.py: 1 image x 8 GPUs, fp32
        row(f'segformer_fan_hybrid_{size}_160k_cityscapes', 6e-5, 0.01, {'pos_block', 'norm'}, 0., total=8,
            warmup=(1500, 1e-6), lr_mult={'head': 10.}, norm_cfg=SYNC_BN, out_norms=False, pos_exponent='linear',
            feat_downsample=False)
    # the Swin-T Cascade 3x recipe the ReViT paper trained ReSwin-T with (AdamW 1e-4, wd 0.05, batch 16), from the
    # released checkpoint's residual mode
    row('cascade_mask_rcnn_reswin_t_3x', 1e-4, 0.05, SWIN_KEYS, 0.2, amp='dynamic',
        residual_mode='official')
    # the paper's ReMViTv2-T recipe = Detectron2 mask_rcnn_mvitv2_t_3x.py (batch 64, AMP, 250 warmup iterations)
    row('mask_rcnn_remvit_t_3x', 1.6e-4, 0.1, {'pos_embed', 'rel_pos_h', 'rel_pos_w', 'norm', 'alpha'}, 0.2,
        total=64, amp='dynamic', warmup=(250, 1e-3))
    # Shunted: the PVTv2 harness (whai362/PVT@57e2dfa detection/configs/*pvt_v2_b2*)
    for size in 'tsb':
        row(f'mask_rcnn_shunted_{size}_1x', 2e-4, 1e-4, (), 0.1, betas=False)
        row(f'mask_rcnn_shunted_{size}_3x', 1e-4, 0.05, SWIN_KEYS, 0.1)
        row(f'cascade_mask_rcnn_shunted_{size}_3x', 1e-4, 0.05, SWIN_KEYS, 0.1, amp='dynamic')
        row(f'retinanet_shunted_{size}_1x', 1e-4, 1e-4, (), 0.1, betas=False)
        # PVT's Semantic FPN, 40k x 32 images at 2e-4, as its 80k x 16 at 1e-4 equivalent (docs/recipes.md)
        row(f'fpn_shunted_{size}_80k_ade20k', 1e-4, 1e-4, (), 0.1, warmup=None, betas=False)
    return rows


OFFICIAL = _official()


def _load(name: str) -> Config:
    return Config.fromfile(osp.join(CONFIGS, name + '.py'))


def _effective(cfg: Config) -> dict:
    """What a run of ``cfg`` trains with, read back from the merged config."""
    wrapper = cfg.optim_wrapper
    paramwise = wrapper.get('paramwise_cfg') or {}
    keys = paramwise.get('custom_keys') or {}
    schedulers = list(cfg.param_scheduler)
    warmup = schedulers[0] if schedulers[0].type == 'LinearLR' else None
    return dict(
        amp=(wrapper.get('loss_scale', 'dynamic') if wrapper.type == 'AmpOptimWrapper' else None),
        optimizer={k: tuple(v) if isinstance(v, list) else v for k, v in wrapper.optimizer.items()},
        keys={k: dict(v) for k, v in keys.items()},
        norm_mult=paramwise.get('norm_decay_mult'), dp=cfg.model.backbone.drop_path_rate,
        warmup=(warmup.end, warmup.start_factor) if warmup else None, decay=schedulers[-1],
        per_gpu=cfg.train_dataloader.batch_size, base_batch=cfg.auto_scale_lr.base_batch_size,
        scale_enabled=cfg.auto_scale_lr.enable, backbone=cfg.model.backbone, train_cfg=cfg.train_cfg)


def test_every_dense_config_has_a_recipe():
    names = {osp.basename(p)[:-3] for p in glob.glob(osp.join(CONFIGS, '*.py'))}
    assert {name for name, _, _ in DENSE} <= names
    assert {key for _, _, key in DENSE} == set(DENSE_RECIPES)
    for name, token, key in DENSE:
        values = recipe_for(token, key)
        assert values.total_batch % GPUS == 0, name
        if values.official:
            assert '@' in values.source and ':' in values.source, name
            assert {'optimizer', 'batch', 'amp'} <= set(values.lines), name
        else:
            assert values.why and not values.reported, f'{name}: a borrowed recipe says why and claims no result'


@pytest.mark.parametrize('name,token,key', DENSE, ids=[n for n, _, _ in DENSE])
def test_config_trains_its_recipe(name, token, key):
    """The loaded config's values are the table's."""
    values, got = recipe_for(token, key), _effective(_load(name))
    assert got['amp'] == values.amp
    assert got['optimizer'] == dict(values.optimizer)
    expected_keys = {k: dict(decay_mult=0.) for k in values.no_decay}
    for k, mult in values.lr_mult.items():
        expected_keys.setdefault(k, {})['lr_mult'] = mult
    assert got['keys'] == expected_keys
    assert got['norm_mult'] == values.norm_decay_mult
    assert got['dp'] == values.drop_path_rate
    assert got['warmup'] == ((values.warmup_iters, values.warmup_ratio) if values.warmup_iters else None)
    assert got['per_gpu'] * values.gpus == got['base_batch'] == values.total_batch and got['scale_enabled'] is False
    if values.gpus != GPUS:  # spread over more GPUs to fit 80 GB: the header says how many, and why
        with open(osp.join(CONFIGS, f'{name}.py')) as f:
            header = f.read().split('_base_')[0].replace('\n# ', ' ')
        assert f'{values.gpus} GPUs x {got["per_gpu"]}: at {values.total_batch // GPUS} images per GPU' in header
    schedule, decay = SCHEDULES[key], got['decay']
    if schedule.max_epochs:
        assert got['train_cfg'].max_epochs == decay.end == schedule.max_epochs
        assert decay.type == 'MultiStepLR' and list(decay.milestones) == list(schedule.milestones)
        assert decay.gamma == 0.1 and decay.by_epoch
    else:
        assert got['train_cfg'].max_iters == decay.end == schedule.max_iters
        assert decay.type == 'PolyLR' and decay.power == schedule.power and decay.eta_min == values.min_lr
        assert decay.begin == values.warmup_iters
    for setting, value in values.backbone.items():
        assert got['backbone'][setting] == value, setting
    init = got['backbone'].get('init_cfg') or {}
    assert init.get('checkpoint_key') == values.checkpoint_key


@pytest.mark.parametrize('name', sorted(OFFICIAL))
def test_official_configs_train_the_official_recipe(name):
    """The official recipes' values, read from the loaded configs, equal the hand transcription above."""
    token, key = next((t, k) for n, t, k in DENSE if n == name)
    assert recipe_for(token, key).official
    want, got = OFFICIAL[name], _effective(_load(name))
    optimizer = dict(type='AdamW', lr=want['lr'], weight_decay=want['wd'])
    if want['betas']:
        optimizer['betas'] = (0.9, 0.999)
    assert got['optimizer'] == optimizer
    assert {k for k, v in got['keys'].items() if v.get('decay_mult') == 0} == want['keys']
    assert {k: v['lr_mult'] for k, v in got['keys'].items() if 'lr_mult' in v} == want['lr_mult']
    assert all(set(v) <= {'decay_mult', 'lr_mult'} for v in got['keys'].values())
    assert got['norm_mult'] == want['norm_mult']
    assert got['dp'] == want['dp'] and got['warmup'] == want['warmup']
    assert got['per_gpu'] * recipe_for(token, key).gpus == got['base_batch'] == want['total']
    assert got['amp'] == want['amp']
    if got['decay'].type == 'PolyLR':
        assert got['decay'].eta_min == want['min_lr']
    for setting, value in want['backbone'].items():
        assert got['backbone'][setting] == value, setting


def test_every_official_entry_is_transcribed():
    official = {name for name, token, key in DENSE if recipe_for(token, key).official}
    assert official == set(OFFICIAL)


def test_fan_l_header_claims_no_in1k_result():
    """FAN-L-Hybrid starts from the IN-22k -> 1k weights (no IN-1k release), so its header must not claim the
    IN-1K row, and it says why."""
    text = open(osp.join(CONFIGS, 'cascade_mask_rcnn_fan_hybrid_l_3x.py')).read()
    assert 'Reported:' not in text
    assert any('in22k' in d for d in recipe_for('fan_hybrid_l', 'cascade_mask_rcnn_3x').deviations)
    assert 'Reported:' in open(osp.join(CONFIGS, 'cascade_mask_rcnn_fan_hybrid_s_3x.py')).read()


def test_fp16_recipe_trains_in_float32_without_gpu(monkeypatch):
    """An AMP config runs on a CPU: tools/train.py turns it to OptimWrapper with one log line; turning AMP off by
    --cfg-options drops the AMP-only loss scale."""
    from mmengine.device import get_device
    if get_device() != 'cpu':
        pytest.skip('checks the CPU fallback')
    cfg = _load('retinanet_rmt_t_1x')
    assert cfg.optim_wrapper.type == 'AmpOptimWrapper' and cfg.optim_wrapper.loss_scale == 512.
    logged = []
    monkeypatch.setattr(entrypoints, 'print_log', lambda msg, *a, **k: logged.append(msg))
    resolve_amp(cfg)
    assert cfg.optim_wrapper.type == 'OptimWrapper' and 'loss_scale' not in cfg.optim_wrapper
    assert len([m for m in logged if 'float32' in m]) == 1
    off = _load('retinanet_rmt_t_1x')
    off.merge_from_dict({'optim_wrapper.type': 'OptimWrapper'})
    resolve_amp(off)
    assert dict(off.optim_wrapper) == dict(type='OptimWrapper', optimizer=dict(cfg.optim_wrapper.optimizer))
    float32 = _load('fpn_rmt_t_80k_ade20k')
    before = float32.optim_wrapper.to_dict()
    resolve_amp(float32)
    assert float32.optim_wrapper.to_dict() == before
