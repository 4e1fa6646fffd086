"""Checkpoint files a run reads, checked before the Runner starts: that each local ``Pretrained`` init,
``load_from`` and ``--resume`` file exists, is complete, holds only tensors and plain data, and (for ``load_from``)
has keys of the model's parts; after the build, that a test or resume checkpoint has a tensor of the right shape for
every model key."""
import importlib.util
import os
import os.path as osp
import re
import urllib.parse
import urllib.request
from typing import Any, Iterator, Optional, Tuple

import torch
from mmengine.config import Config

from mmvisatt.checkpoint import (CheckpointDownloadError, CheckpointMismatchError, convert_state_dict,
                                 download_checkpoint, file_head, is_url, load_checkpoint_file, not_a_checkpoint,
                                 unwrap_state_dict)
from mmvisatt.checkpoint.fit import classes_hint, weights_fit_problem
from mmvisatt.checkpoint.loading import abbreviate
from ..reliability import checkpoint_problem


class MissingCheckpointError(FileNotFoundError):
    """A checkpoint the config initialises from is not on disk."""


class CorruptCheckpointError(RuntimeError):
    """A checkpoint file is incomplete or corrupt."""


def pretrained_inits(node: Any, path: str = 'model') -> Iterator[Tuple[str, dict]]:
    """``(dotted path, init_cfg)`` of every ``Pretrained`` init in a model config."""
    if isinstance(node, dict):
        init = node.get('init_cfg')
        for item in init if isinstance(init, list) else [init]:
            if isinstance(item, dict) and item.get('type') == 'Pretrained':
                yield f'{path}.init_cfg', item
        for key, value in node.items():
            if key != 'init_cfg':
                yield from pretrained_inits(value, f'{path}.{key}')
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from pretrained_inits(value, f'{path}.{i}')


def fetch_url(url: str, where: str) -> str:
    """Download (or find in the cache) the checkpoint ``url`` that ``where`` names, checked to open
    (:func:`~mmvisatt.checkpoint.download_checkpoint`): a 404, a web page or a dead host stops the run here, before
    the Runner is built. Every process of a run calls it; the first one per cache downloads, the others wait."""
    try:
        return download_checkpoint(url)
    except CheckpointDownloadError as error:
        raise CheckpointDownloadError(f'{where}: {error}') from None


#: the schemes mmengine reads through petrel_client (its PetrelBackend, and CheckpointLoader's s3 loader)
PETREL_SCHEME = re.compile(r'^(\S+:)?s3://')


def resolve_uri(path: Any, where: str) -> Any:
    """``path`` as the run can read it: a ``file://`` URI as its local path (mmengine reads it as a relative path
    that does not exist); an ``s3://`` one refused here when petrel_client, which mmengine reads it through, is
    not installed (mmengine would stop after the build with an ImportError). Other values unchanged."""
    if not isinstance(path, str):
        return path
    if path.startswith('file://'):
        return urllib.request.url2pathname(urllib.parse.urlsplit(path).path)
    if PETREL_SCHEME.match(path) and importlib.util.find_spec('petrel_client') is None:
        raise MissingCheckpointError(
            f'{where}: {path}: mmengine reads s3:// checkpoints through petrel_client (its PetrelBackend), which is '
            f'not installed here. Copy the file to a local disk (e.g. aws s3 cp {path} PATH) and pass its path, or '
            'install petrel_client.')
    return path


def resolve_checkpoint_uris(cfg: Config) -> None:
    """Every checkpoint the run reads (``Pretrained`` inits, ``load_from``), through :func:`resolve_uri`, in place."""
    for where, init in pretrained_inits(cfg.get('model')):
        init['checkpoint'] = resolve_uri(init.get('checkpoint'), f'{where}.checkpoint')
    if cfg.get('load_from'):
        cfg.load_from = resolve_uri(cfg.load_from, '--resume' if cfg.get('resume') else 'load_from')


def check_pretrained(cfg: Config) -> None:
    """Raise :class:`MissingCheckpointError` if a local ``Pretrained`` checkpoint is missing; download ``http(s)://``
    ones now (:func:`fetch_url`).

    ``file://`` and ``s3://`` are resolved first (:func:`resolve_checkpoint_uris`); other schemes
    (``open-mmlab://``, ``torchvision://``) are left to mmengine. A config can say where its default checkpoint
    comes from in a top-level ``pretrained_source`` string, printed when the missing file is the config's own
    ``pretrained`` path, and name a Google Drive file id in ``pretrained_gdown``, printed as the command that fetches
    it on a node without a browser.
    """
    for where, init in pretrained_inits(cfg.get('model')):
        ckpt = init.get('checkpoint')
        if is_url(ckpt):
            fetch_url(ckpt, f'{where}.checkpoint')
            continue
        if not ckpt or '://' in ckpt or osp.exists(osp.expanduser(ckpt)):
            continue
        lines = [f'Checkpoint for {where} not found: {ckpt}']
        if cfg.get('pretrained_source') and ckpt == cfg.get('pretrained'):
            lines.append(f'Download it from: {cfg.pretrained_source}')
            if cfg.get('pretrained_gdown'):
                lines.append('On a node without a browser: pip install gdown && '
                             f'gdown {cfg.pretrained_gdown} -O {ckpt}')
        lines += [f'Save it as {ckpt}, or pass the file you have with',
                  f'    --cfg-options {where}.checkpoint=PATH',
                  f'(train from random weights with --cfg-options {where}=None; --demo needs no checkpoint).']
        raise MissingCheckpointError('\n'.join(lines))


def missing_local_file(path: Optional[str]) -> bool:
    """Whether ``path`` names a local file (``~`` expanded) that is not there; URLs are left to their loader."""
    return bool(path) and '://' not in path and not osp.isfile(osp.expanduser(path))


def check_resume_file(cfg: Config) -> None:
    """``--resume PATH`` names a file that exists (mmengine would fail in torch.load with its traceback)."""
    path = cfg.get('load_from')
    if cfg.get('resume') and missing_local_file(path):
        raise MissingCheckpointError(
            f'--resume {path}: no such file (working directory: {os.getcwd()}). Pass the path of a checkpoint the '
            f'run wrote (work_dir/epoch_N.pth or iter_N.pth), or a bare --resume to continue from the newest '
            f'complete one in the work dir.')


def check_checkpoint_file(path: Optional[str], what: str, fix: str, zip_only: bool = False) -> Optional[dict]:
    """Raise :class:`CorruptCheckpointError` if the local checkpoint ``path`` is incomplete; return what it holds
    (memory-mapped; None for a URL, a missing file or one left to its loader).

    Zip-format files (``torch.save`` since torch 1.6) are checked fully. Files in the legacy pickle format cannot be
    checked without loading them and pass; so does anything else when ``zip_only`` (foreign files, e.g. an official
    release, are then left to the loader). Every torch file is then read as data (memory-mapped where it can be):
    one that holds more than tensors and plain data raises :class:`UnsafeCheckpointError` before the run starts.
    """
    if not path or '://' in path:
        return None
    path = osp.expanduser(path)
    if not osp.isfile(path):
        return None
    head = file_head(path)
    problem = not_a_checkpoint(path, head)
    if problem is not None:
        raise CorruptCheckpointError(f'{what} {path} is {problem}.')
    zipped = head.startswith(b'PK\x03\x04')
    if head[:1] != b'\x80' and (zipped or not zip_only):
        problem = checkpoint_problem(path)
        if problem is not None:
            raise CorruptCheckpointError(f'{what} {path} is {problem}. {fix}')
    return load_checkpoint_file(path, 'cpu', mmap=True) if zipped or head[:1] == b'\x80' else None


def check_load_from_fits(model_cfg: Any, path: str, checkpoint: Optional[dict]) -> None:
    """Refuse a ``load_from`` file (``checkpoint``: what it holds, from :func:`check_checkpoint_file`) none of whose
    keys belongs to a part of the model (a backbone-only ImageNet file, say): mmengine would load nothing, say
    nothing, and train the model from its initialisation."""
    if checkpoint is None or not isinstance(model_cfg, dict):
        return
    parts = sorted(k for k, v in model_cfg.items() if isinstance(v, dict) and k != 'data_preprocessor')
    state = unwrap_state_dict(checkpoint)
    if not state or not parts or any(k.split('.', 1)[0] in parts for k in state):
        return
    try:
        _, family, layout = convert_state_dict(state)
        what = f'a {family} backbone alone ({layout} layout, e.g. an ImageNet checkpoint)'
    except CheckpointMismatchError:
        what = f'weights of another model (first keys: {abbreviate(sorted(state), 4)})'
    raise CheckpointMismatchError(
        f'load_from {path} holds {what}: none of its keys belongs to the model\'s {", ".join(parts)}. load_from '
        f'matches whole-model keys, so nothing would load and the model would train from its initialisation. To '
        f'start the backbone from this file, pass --cfg-options model.backbone.init_cfg._delete_=True '
        f'model.backbone.init_cfg.type=Pretrained model.backbone.init_cfg.checkpoint={path} instead of load_from '
        f'(_delete_ replaces whatever init_cfg the config has, None included).')


def check_model_files(cfg: Config) -> None:
    """Refuse truncated ``Pretrained`` / ``load_from`` / ``--resume PATH`` checkpoints before the Runner starts."""
    for where, init in pretrained_inits(cfg.get('model')):
        check_checkpoint_file(init.get('checkpoint'), f'The checkpoint of {where}',
                              f'Download it again, or pass another one with --cfg-options {where}.checkpoint=PATH.',
                              zip_only=True)
    what = '--resume checkpoint' if cfg.get('resume') else 'load_from checkpoint'
    load_from = cfg.get('load_from')
    if is_url(load_from):
        load_from = fetch_url(load_from, '--resume' if cfg.get('resume') else 'load_from')
    checkpoint = check_checkpoint_file(load_from, f'The {what}',
                                       'It was probably written by a job that was killed or ran out of disk; pick an '
                                       'earlier checkpoint, or use --resume (auto), which skips incomplete files.')
    if not cfg.get('resume'):
        check_load_from_fits(cfg.get('model'), load_from, checkpoint)


def check_checkpoint_fits(model: torch.nn.Module, path: str, demo: bool = False, hint: str = '') -> None:
    """Raise :class:`CheckpointMismatchError` unless the local checkpoint has a tensor of the model's shape for
    every model key: mmengine loads test checkpoints with ``strict=False`` and evaluates whatever results."""
    if '://' in path:
        return
    from mmengine.model import is_model_wrapper
    model = model.module if is_model_wrapper(model) else model
    checkpoint = load_checkpoint_file(path, 'cpu', mmap=True)
    problem = weights_fit_problem(model, checkpoint, hint or classes_hint(checkpoint, demo))
    if problem:
        raise CheckpointMismatchError(f'{path}: {problem}')
