"""The statements of the source papers (``shared/seeds/``, Chinese-language full texts) that the project builds on,
pinned: each fact quotes the seed, and a test checks the code, configs and docs against it, so a change that
drifts from a paper fails here. Where the seeds are beside the checkout (CI, developers), every quote is also
checked against the seed's text."""
import math
import os.path as osp
from pathlib import Path
from typing import NamedTuple

import pytest
import torch
from mmengine.config import Config

from conftest import CONFIGS, REPO
from mmvisatt.analysis.paper_results import reported
from mmvisatt.models.backbones.evt import EVT
from mmvisatt.models.backbones import ReMViTv2, ReSwinTransformer, ReViT
from mmvisatt.models.backbones.rmt import RMT
from mmvisatt.models.backbones.shunted import ShuntedTransformer
from mmvisatt.models.backbones.fan import channel_gate
from mmvisatt.recipes import PAPER_VS_CODE, recipe_for
from mmvisatt.task_configs import RECIPES, recipe_key

SEEDS = Path(REPO).parent / 'shared' / 'seeds'
REVIT, FAN, EVT_SEED, SHUNTED = ('000_7634adc57a3a7b78.txt', '001_ca41bef01fec00d4.txt', '003_48b467d1b16ca2f7.txt',
                                 '004_a3be0a6daf77a360.txt')


class Fact(NamedTuple):
    seed: str
    section: str
    quote: str  # verbatim from the seed


FACTS = {
    # EVT (seed 003)
    'evt_block': Fact(EVT_SEED, '3.2', '一個 EVT 模塊包含三個主要模塊：條件位置編碼（CPE）[47]、歐幾里得自注意力（EuSA）以及經(jīng)典的前饋網(wǎng)絡(luò)（FFN）'
                      '[46]'),
    'evt_drop_path': Fact(EVT_SEED, '4.1', '深度 [86] 的最大遞增率對于 EVT-T/S/B/L 分別設(shè)置為 0.1/0.15/0.4/0.55'),
    'evt_imagenet': Fact(EVT_SEED, '4.1', '初始學(xué)習(xí)率、權(quán)重衰減和批量大小分別設(shè)置為 0.001、0.05 和 1024'),
    'evt_l_params': Fact(EVT_SEED, '1', '我們的 EVT-L 模型僅包含 1 億（100M）參數(shù)，即實現(xiàn)了 86.6% 的 top-1 準(zhǔn)確率'),
    'evt_t_deeper': Fact(EVT_SEED, '4.6', '首先，我們采用了更深的模型'),
    'evt_per_head': Fact(EVT_SEED, '4.6', '在多頭注意力中為每個頭設(shè)置不同的衰減系數(shù)'),
    'evt_swin': Fact(EVT_SEED, '4.6', '僅將 Swin-Transformer 中的 WSA/SWSA 替換為我們的 EuSAg/EuSAd，并將 Swin-Transformer 中的普通注意力替換'
                     '為我們的 EuSA，同時未使用諸如 CPE 和 Conv Stem 等額外模塊'),
    'evt_variants': Fact(EVT_SEED, '3.5', '我們還設(shè)計了 EVT-Swin-T/S/B'),
    'evt_fpn': Fact(EVT_SEED, '4.3', 'EVT-T/S/B/L 分別實現(xiàn)了 48.3、50.0、51.7 和 52.0 的 mIoU'),
    'evt_upernet': Fact(EVT_SEED, '4.3', 'EVT-B 實現(xiàn)了 52.7 的 mIoU'),
    'evt_robustness': Fact(EVT_SEED, '4.4', 'EVT-L 在 ImageNet-A 上實現(xiàn)了 55.5 的準(zhǔn)確率，在 ImageNet-R 上實現(xiàn)了 56.9'
                           ' 的準(zhǔn)確率'),
    'evt_groups': Fact(EVT_SEED, '4.6', '49 或 32 個 token 的組，必要時進(jìn)行填充'),
    'rmt_manhattan': Fact(EVT_SEED, '3.1', '由此得到了 RMT 中使用的基于曼哈頓距離的空間衰減'),
    # ReViT (seed 000)
    'revit_layers': Fact(REVIT, 'Implementation Details', '作者仅依赖于包含12层的基础版ViT，并将其称为ViT-B'),
    'revit_b_imagenet': Fact(REVIT, 'Implementation Details', '基础学习率设置为0.001，预热周期为30，有效批量大小为4096，权重衰减设置为0.3'),
    'reswin_imagenet': Fact(REVIT, 'Implementation Details', '将基础学习率设置为0.001，预热周期为20，有效批量大小为1024，权重衰减设置为0.05'),
    'remvit_imagenet': Fact(REVIT, 'Implementation Details', '基础学习率设置为0.002，预热周期为70，有效批量大小为2048，权重衰减设置为0.1'),
    'revit_clip': Fact(REVIT, 'Implementation Details', '使用了梯度裁剪和余弦调度学习率预热/衰减'),
    'revit_det': Fact(REVIT, 'Implementation Details', '并使用线性调度学习率衰减，训练了36个周期'),
    'reswin_det': Fact(REVIT, 'Implementation Details', '对于ReSwin-T网络的训练，初始学习率设置为0.0001，权重衰减为0.05，批量大小设置为16'),
    'remvit_det': Fact(REVIT, 'Implementation Details', '对于ReMViTv2-T模型的训练，初始学习率设置为0.00016，权重衰减为0.1，批量大小设置为64'),
    'multiscale_12_layers': Fact(REVIT, 'Implementation Details', '即每种都有12层的MViTv2-T和Swin-T'),
    # FAN (seed 001)
    'fan_prototype': Fact(FAN, '3.4', '作者通过对通道维度进行平均生成一个token原型'),
    'fan_sigmoid': Fact(FAN, '3.4', '作者没有应用Softmax函数，而是使用Sigmoid函数来归一化注意权重'),
    # Shunted (seed 004)
    'shunted_heads': Fact(SHUNTED, '3.3', '每个块中的头数设置为2,4,8,16'),
    'shunted_variants': Fact(SHUNTED, '3.3', '变体仅来自不同阶段的层数'),
    'shunted_stem': Fact(SHUNTED, '3.2', '作者将步长为2且零填充的7×7卷积层作为patch嵌入的第一层，并根据模型大小增加步长为1的额外3×3卷积层'),
    'shunted_stem_range': Fact(SHUNTED, '3.3', 'patch嵌入中的卷积范围为1到3'),
}


@pytest.mark.skipif(not SEEDS.is_dir(), reason=f'the source documents are not beside this checkout ({SEEDS})')
@pytest.mark.parametrize('name', sorted(FACTS))
def test_every_quote_is_in_its_seed(name):
    fact = FACTS[name]
    assert fact.quote in (SEEDS / fact.seed).read_text(encoding='utf-8'), f'{name}: not in {fact.seed}'


def _preset(token: str) -> Config:
    return Config.fromfile(osp.join(CONFIGS, '_base_', 'backbones', f'{token}.py')).preset


def _blocks(model) -> int:
    return sum(len(stage.blocks) for stage in model.stages)


# --------------------------------------------------------------------------------------------------------- EVT

def test_evt_block_is_cpe_eusa_ffn():
    """evt_block: nothing beyond CPE, EuSA (q, k, v, out projections) and the two-layer FFN, around two norms."""
    block = EVT(arch='t').stages[1].blocks[0]
    assert sorted(name for name, _ in block.named_children()) == ['attn', 'cpe', 'drop_path', 'ffn', 'norm1', 'norm2']
    assert {n for n, _ in block.attn.named_parameters()} == {
        f'{p}_proj.{w}' for p in ('q', 'k', 'v', 'out') for w in ('weight', 'bias')}
    assert [n for n, m in block.ffn.named_modules() if isinstance(m, torch.nn.Linear)] == ['fc1', 'fc2']
    assert not [n for n, m in block.ffn.named_modules() if isinstance(m, torch.nn.Conv2d)]


@pytest.mark.parametrize('size, rate', [('t', 0.1), ('s', 0.15), ('b', 0.4), ('l', 0.55)])
def test_evt_drop_path(size, rate):
    """evt_drop_path: the presets, the ImageNet configs and every dense recipe."""
    assert EVT.arch_zoo[size]['drop_path_rate'] == rate
    assert _preset(f'evt_{size}').drop_path_rate == rate
    cfg = Config.fromfile(osp.join(CONFIGS, f'imagenet_evt_{size}.py'))
    assert cfg.model.backbone.drop_path_rate == rate
    for recipe in RECIPES:
        if recipe.task != 'cls' and recipe.applies_to(f'evt_{size}'):
            assert recipe_for(f'evt_{size}', recipe_key(recipe)).drop_path_rate == rate
            task = Config.fromfile(osp.join(CONFIGS, recipe.name.format(bb=f'evt_{size}') + '.py'))
            assert task.model.backbone.drop_path_rate == rate


@pytest.mark.parametrize('size', ['t', 's', 'b', 'l'])
def test_evt_imagenet_settings(size):
    """evt_imagenet: AdamW, lr 1e-3 at batch 1024, weight decay 0.05, cosine decay."""
    cfg = Config.fromfile(osp.join(CONFIGS, f'imagenet_evt_{size}.py'))
    opt = cfg.optim_wrapper.optimizer
    assert (opt.type, opt.lr, opt.weight_decay, cfg.auto_scale_lr.base_batch_size) == ('AdamW', 1e-3, 0.05, 1024)
    assert cfg.param_scheduler[-1].type == 'CosineAnnealingLR'


def test_evt_l_has_about_100m_parameters():
    """evt_l_params: the whole ImageNet classifier of our EVT-L, to the paper's precision (100M)."""
    from mmpretrain.registry import MODELS
    from mmengine.registry import DefaultScope
    cfg = Config.fromfile(osp.join(CONFIGS, 'imagenet_evt_l.py'))
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        model = MODELS.build(cfg.model)
    assert round(sum(p.numel() for p in model.parameters()) / 1e6) == 100


def test_evt_t_is_deeper_than_rmt_t():
    assert _blocks(EVT(arch='t')) > _blocks(RMT(arch='t'))


def test_evt_decay_differs_per_head():
    for size in ('t', 's', 'b', 'l', 'swin_t', 'swin_s', 'swin_b'):
        for stage in EVT(arch=size).stages:
            gammas = stage.decay.log_gamma.tolist()
            assert len(set(gammas)) == len(gammas) > 1


@pytest.mark.parametrize('size, swin', [('t', 'ReSwinTransformer'), ('s', 'ReSwinTransformer'),
                                        ('b', 'ReSwinTransformer')])
def test_evt_swin_has_swin_configurations(size, swin):
    """evt_swin, evt_variants: Swin-T/S/B's widths, depths and heads; no CPE, no conv stem; EuSA throughout."""
    ours, swin_model = EVT(arch=f'swin_{size}'), ReSwinTransformer(arch=size)
    assert ours.num_features == swin_model.num_features
    assert [len(s.blocks) for s in ours.stages] == [len(s.blocks) for s in swin_model.stages]
    assert [s.decay.log_gamma.numel() for s in ours.stages] == list(ReSwinTransformer.arch_zoo[size]['num_heads'])
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in ours.modules())
    assert not any(hasattr(b, 'cpe') for s in ours.stages for b in s.blocks)
    assert [set(s.modes) for s in ours.stages] == [{'grouped', 'dilated'}] * 3 + [{'full'}]


def test_evt_groups_of_49_tokens():
    assert EVT(arch='t').group_size == 49


@pytest.mark.parametrize('token, recipe, value', [
    ('evt_t', 'fpn_80k_ade20k', 48.3), ('evt_s', 'fpn_80k_ade20k', 50.0), ('evt_b', 'fpn_80k_ade20k', 51.7),
    ('evt_l', 'fpn_80k_ade20k', 52.0), ('evt_b', 'upernet_160k_ade20k', 52.7)])
def test_evt_reported_segmentation(token, recipe, value):
    """evt_fpn, evt_upernet: the paper's numbers beside our configs, in the zoo, the metafile and docs/evt.md."""
    assert reported(token, recipe).metrics == {'mIoU': value}
    config = recipe.replace('_', f'_{token}_', 1)
    assert f'`{config}` |' in _zoo_row(config) and f'| {value:.1f} |' in _zoo_row(config)
    assert str(value) in Path(REPO, 'configs', 'metafiles', 'evt.yml').read_text().split(f'Name: {config}\n')[1] \
        .split('- Name:')[0]
    assert str(value) in Path(REPO, 'docs', 'evt.md').read_text()


def test_evt_l_reported_imagenet():
    """evt_l_params, evt_robustness: 86.6 top-1 (at 384), ImageNet-A 55.5, ImageNet-R 56.9 beside imagenet_evt_l."""
    paper = reported('evt_l', 'imagenet')
    assert paper.metrics == {'top-1': 86.6, 'ImageNet-A top-1': 55.5, 'ImageNet-R top-1': 56.9}
    assert paper.params_m == 100 and '384' in paper.note
    entry = Path(REPO, 'configs', 'metafiles', 'evt.yml').read_text().split('Name: imagenet_evt_l\n')[1]
    entry = entry.split('- Name:')[0]
    assert all(s in entry for s in ('Dataset: ImageNet-A', 'top-1: 55.5', 'Dataset: ImageNet-R', 'top-1: 56.9',
                                    'top-1: 86.6', '384'))
    doc = Path(REPO, 'docs', 'evt.md').read_text()
    assert all(s in doc for s in ('86.6', '55.5', '56.9', '384'))


def _zoo_row(config: str) -> str:
    return next(line for line in Path(REPO, 'docs', 'model_zoo.md').read_text().splitlines()
                if line.startswith(f'| `{config}` |'))


def test_rmt_decay_is_manhattan():
    """rmt_manhattan (and the EVT contrast): RMT's full-attention bias is |dy| + |dx| times log gamma."""
    stage = RMT(arch='t').stages[3]
    bias = stage.context(2, 3, torch.float64)[2]
    assert math.isclose(bias[0, 0, 5].item(), 3 * stage.decay.log_gamma[0].item(), rel_tol=1e-6)


# ------------------------------------------------------------------------------------------------------- ReViT

def test_revit_b_and_reswin_t_have_12_layers():
    """revit_layers, multiscale_12_layers (for Swin-T; MViTv2-T has 10 blocks, PAPER_VS_CODE says so)."""
    assert len(ReViT(arch='b').blocks) == 12
    assert sum(ReSwinTransformer.arch_zoo['t']['depths']) == 12
    assert sum(ReMViTv2.arch_zoo['t']['depths']) == 10
    assert any(r.model == 'ReMViTv2-T' and '12 layers' in r.paper and '1-2-5-2' in r.code for r in PAPER_VS_CODE)


@pytest.mark.parametrize('model, numbers', [
    ('ReViT-B', ('Adam', 'lr 1e-3', '30 warmup', 'batch 4096', 'weight decay 0.3', 'gradient clipping')),
    ('ReSwin-T', ('AdamW', 'lr 1e-3', '20 warmup', 'batch 1024', 'weight decay 0.05', 'gradient clipping')),
    ('ReMViTv2-T', ('AdamW', 'lr 2e-3', '70 warmup', 'batch 2048', 'weight decay 0.1', 'gradient clipping'))])
def test_revit_imagenet_settings_are_listed_against_the_code(model, numbers):
    """revit_b_imagenet, reswin_imagenet, remvit_imagenet, revit_clip: docs/recipes.md lists the paper's values beside
    the code's, and says which one the config uses."""
    row = next(r for r in PAPER_VS_CODE if r.model == model and r.setting.startswith('ImageNet'))
    assert all(n in row.paper for n in numbers) and row.config.startswith('the code')
    assert f'| {row.model} | {row.setting} | {row.paper} |' in Path(REPO, 'docs', 'recipes.md').read_text()


@pytest.mark.parametrize('config, lr, wd, batch', [('cascade_mask_rcnn_reswin_t_3x', 1e-4, 0.05, 16),
                                                   ('mask_rcnn_remvit_t_3x', 1.6e-4, 0.1, 64)])
def test_revit_detection_settings(config, lr, wd, batch):
    """revit_det, reswin_det, remvit_det: AdamW, 36 epochs, and the paper's lr, weight decay and batch; the schedule
    shape (linear in the paper, steps in the official files) is listed in docs/recipes.md."""
    cfg = Config.fromfile(osp.join(CONFIGS, f'{config}.py'))
    opt = cfg.optim_wrapper.optimizer
    assert (opt.type, opt.lr, opt.weight_decay) == ('AdamW', lr, wd)
    assert cfg.auto_scale_lr.base_batch_size == batch and cfg.train_cfg.max_epochs == 36
    assert any(r.setting == 'detection schedule' and 'linear' in r.paper for r in PAPER_VS_CODE)


def test_reswin_t_runs_in_the_mode_its_weights_were_trained_in():
    assert ReSwinTransformer(arch='t').residual_mode == 'official'
    assert _preset('reswin_t').backbone.residual_mode == 'official'


# --------------------------------------------------------------------------------------------------------- FAN

def test_fan_channel_gate_is_a_sigmoid_over_a_channel_averaged_prototype():
    """fan_prototype, fan_sigmoid: gates in (0, 1) that do not sum to one over the channels, and a key that enters
    only through its mean over each head's channels."""
    torch.manual_seed(0)
    q, k = torch.randn(2, 10, 8), torch.randn(2, 10, 8)
    gate = channel_gate(q, k, 2)
    assert ((gate > 0) & (gate < 1)).all() and not torch.allclose(gate.sum(-1), torch.ones(2, 2))
    # a key whose per-head channel mean is unchanged (after the softmax over tokens) gives the same gate
    same_mean = k.softmax(1).reshape(2, 10, 2, 4)
    permuted = same_mean[..., torch.tensor([3, 2, 1, 0])].reshape(2, 10, 8).log()
    assert torch.allclose(channel_gate(q, permuted, 2), gate, atol=1e-6)


# ----------------------------------------------------------------------------------------------------- Shunted

def test_shunted_heads_widths_and_stem():
    """shunted_heads, shunted_variants, shunted_stem, shunted_stem_range."""
    zoo = ShuntedTransformer.arch_zoo
    assert all(tuple(a['num_heads']) == (2, 4, 8, 16) for a in zoo.values())
    assert len({(tuple(a['embed_dims']), tuple(a['mlp_ratios']), tuple(a['sr_ratios'])) for a in zoo.values()}) == 1
    assert [1 + zoo[s]['num_conv'] for s in ('t', 's', 'b')] == [1, 2, 3]
    first = next(m for m in ShuntedTransformer(arch='t').modules() if isinstance(m, torch.nn.Conv2d))
    assert first.kernel_size == (7, 7) and first.stride == (2, 2) and first.padding == (3, 3)
