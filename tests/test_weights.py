"""Where users get the ImageNet weights: the generated page, direct downloads named by URL in the presets, and a
training run whose backbone ``init_cfg`` is a URL (served here on 127.0.0.1): downloaded once, converted, reported."""
import http.server
import os.path as osp
import re
import threading

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import MODELS

from conftest import CONFIGS, REPO
from mmvisatt.metafiles import weights_page
from mmvisatt.task_configs import backbone_tokens


def test_the_weights_page_is_the_generated_one():
    with open(osp.join(REPO, 'docs', 'weights.md')) as f:
        assert f.read() == weights_page(CONFIGS), 'run tools/misc/generate_configs.py'


def test_direct_downloads_are_urls_and_manual_files_say_where_to_get_them():
    for token in backbone_tokens(CONFIGS):
        preset = Config.fromfile(osp.join(CONFIGS, '_base_', 'backbones', f'{token}.py'))
        source, path = preset.pretrained_source, preset.pretrained
        assert preset.preset.backbone.init_cfg.checkpoint == path
        if re.fullmatch(r'https://\S+\.(pth|pyth|pth\.tar)', source):
            assert path == source, token  # a release file: downloaded by the run itself
        else:
            assert path.startswith('checkpoints/') and source, token


class _Server:
    """A file server on 127.0.0.1 that records the requests. ``files[path]`` is the body to serve, or a list of
    ``(status, body)`` answers, one per request (the last one repeats); other paths get a 404."""

    def __init__(self, files: dict):
        self.requests = []
        self.files = files
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                server.requests.append(self.path)
                body, status = files.get(self.path), 200
                if isinstance(body, list):
                    status, body = body.pop(0) if len(body) > 1 else body[0]
                if body is None:
                    self.send_error(404)
                    return
                self.send_response(status)
                self.send_header('Content-Length', str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
        self.url = f'http://127.0.0.1:{self.httpd.server_address[1]}'
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def served_backbone(tiny_det_config, tmp_path):
    """The tiny ReSwin of ``tiny_det_config`` saved as a classifier's training checkpoint (``state_dict`` with the
    ``backbone.`` prefix, as the ImageNet configs write it) and served over HTTP; yields (server, url, weights)."""
    cfg = Config.fromfile(tiny_det_config)
    backbone = dict(cfg.model.backbone, init_cfg=None)
    torch.manual_seed(3)
    weights = {k: v.clone() for k, v in MODELS.build(backbone).state_dict().items()
               if not k.startswith(('norm0', 'norm1', 'norm2'))}  # a classifier has the last stage's norm only
    path = tmp_path / 'release.pth'
    torch.save({'state_dict': {f'backbone.{k}': v for k, v in weights.items()}}, path)
    server = _Server({'/weights/reswin_tiny_release.pth': path.read_bytes()})
    yield server, f'{server.url}/weights/reswin_tiny_release.pth', weights
    server.close()


def test_a_url_init_cfg_is_downloaded_once_converted_and_reported(served_backbone, tiny_det_config, tmp_path,
                                                                  monkeypatch):
    import mmvisatt.checkpoint.loading as loading
    from mmvisatt.engine import train_main
    server, url, weights = served_backbone
    monkeypatch.setenv('TORCH_HOME', str(tmp_path / 'torch_home'))
    lines = []
    original = loading.print_log
    monkeypatch.setattr(loading, 'print_log', lambda msg, *a, **k: (lines.append(msg), original(msg, *a, **k)))
    train_main([tiny_det_config, '--demo', '--work-dir', str(tmp_path / 'run'), '--cfg-options',
                f'model.backbone.init_cfg.checkpoint={url}', 'train_cfg.max_iters=1',
                'val_dataloader.dataset.indices=2', 'visualizer.name=url_init'])
    from mmvisatt.checkpoint import url_cache_path
    cached = url_cache_path(url)
    assert cached.startswith(str(tmp_path / 'torch_home' / 'hub' / 'checkpoints' / 'mmvisatt')) and osp.isfile(cached)
    assert osp.basename(cached) == 'reswin_tiny_release.pth'
    reports = [line for line in lines if line.startswith('Loaded ')]
    assert len(reports) == 1 and url in reports[0], reports
    assert '(mmvisatt layout)' in reports[0] and 'newly initialised' in reports[0], reports[0]
    assert int(re.search(r'(\d+) tensors matched', reports[0]).group(1)) == len(weights)
    # a second read (the next run, another rank) takes the cached copy
    again = loading.read_checkpoint(url)
    assert server.requests == ['/weights/reswin_tiny_release.pth']
    assert torch.equal(again['state_dict']['backbone.patch_embed.proj.weight'],
                       weights['patch_embed.proj.weight'])


def test_the_own_project_page_is_generated_and_its_blocks_build_what_they_say():
    """docs/own_project.md: each class's block, pasted over a Mask R-CNN of an outside project, builds the backbone
    and optimizer of the preset's shipped Mask R-CNN 1x config, its outputs have the channels the block gives the
    neck, and the detector trains a step with that optimizer."""
    from mmdet.registry import MODELS as DET_MODELS
    from mmdet.testing import demo_mm_inputs
    from mmdet.utils import register_all_modules
    from mmengine.optim import build_optim_wrapper
    from mmvisatt.metafiles import own_project_config, own_project_page
    import mmvisatt.models  # noqa: F401  (registers the backbones)
    register_all_modules()
    with open(osp.join(REPO, 'docs', 'own_project.md')) as f:
        text = f.read()
    assert text == own_project_page(CONFIGS), 'run tools/misc/generate_configs.py'
    assert 'torch 2.6 or newer' in text and 'CVE-2025-32434' in text and '`mmdet>=3.3.0,<3.4.0`' in text
    blocks = re.findall(r'```python\n(custom_imports.*?)```', text, re.S)
    tokens = re.findall(r'The block for .*? \(`configs/mask_rcnn_(\w+)_1x\.py`\)', text)
    # ReViT, ReSwinTransformer, ReMViTv2, FANViT, FANHybrid, FANSwin, RMT, EVT, ShuntedTransformer
    assert len(blocks) == len(tokens) == 9
    base = osp.join(CONFIGS, '_base_', 'models', 'mask_rcnn_fpn.py')
    for block, token in zip(blocks, tokens):
        cfg = Config.fromstring(f'_base_ = [{base!r}]\n' + block, '.py')
        shipped = own_project_config(CONFIGS, token)
        assert cfg.custom_imports.imports == ['mmvisatt.models', 'mmvisatt.engine', 'mmvisatt.datasets.transforms']
        pasted = {k: cfg[k].to_dict() for k in ('model', 'optim_wrapper')}
        assert pasted['model']['backbone'].pop('_delete_') and pasted['optim_wrapper'].pop('_delete_')
        assert pasted['model']['backbone'] == shipped.model.backbone.to_dict(), token
        assert pasted['optim_wrapper'] == shipped.optim_wrapper.to_dict(), token
        backbone = dict(pasted['model']['backbone'], init_cfg=None)
        if backbone.get('norm_cfg', {}).get('type') == 'SyncBN':
            backbone['norm_cfg'] = dict(backbone['norm_cfg'], type='BN')  # one process, no process group
        with torch.device('meta'):
            outputs = MODELS.build(backbone)(torch.empty(1, 3, 224, 224))
        assert [o.shape[1] for o in outputs] == cfg.model.neck.in_channels, token
        # the whole detector with the block's optimizer trains a step (AMP needs a GPU: float32 here)
        torch.manual_seed(0)
        model = DET_MODELS.build(dict(cfg.model, backbone=backbone))
        optim = dict(pasted['optim_wrapper'], **({} if torch.cuda.is_available() else dict(type='OptimWrapper')))
        optim_wrapper = build_optim_wrapper(model, optim)
        data = demo_mm_inputs(batch_size=1, image_shapes=[(3, 128, 128)], num_items=[2], num_classes=80,
                              with_mask=True)
        losses = model.train_step(data, optim_wrapper)
        assert all(torch.isfinite(v).all() for v in losses.values()), token
