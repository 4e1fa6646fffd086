"""Loading foreign checkpoints into mmvisatt backbones, loudly.

mmdet's Swin ``init_weights`` loads with ``strict=False`` and keeps only ``backbone.`` keys, so a checkpoint in
the wrong layout silently initialises nothing. Here every load goes through a family converter (official /
timm / mm layouts -> mmvisatt keys), logs a one-line report and raises when the backbone's own parameters are
not all covered, apart from the extras the backbone declares as new (such as a residual gate or the output
norms that only dense tasks use).
"""
import fnmatch
import os
import re
import os.path as osp
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

import torch
from mmengine.logging import print_log
from mmengine.runner.checkpoint import CheckpointLoader

from .download import download_checkpoint, is_url
from .safe_load import load_checkpoint_file

StateDict = Dict[str, torch.Tensor]
# A family's key map: foreign (official / timm / mmdet) keys -> mm-style keys ('backbone.*', 'head.fc.*') and the
# name of the layout it recognised, or None when the layout is not its family's. It gets the keys inside
# 'backbone.' of an mm-style file (prefixed=True: an official backbone trained by mmdet / mmseg) or the raw file.
Converter = Callable[[Mapping[str, torch.Tensor], bool], Optional[Tuple[StateDict, str]]]


@dataclass(frozen=True)
class _Family:
    convert: Optional[Converter]  # None: the family has no foreign layout (no release outside mmvisatt)
    is_mm: Callable[[Set[str]], bool]
    keep: Tuple[str, ...]


_CONVERTERS: Dict[str, _Family] = {}

# Keys under which training scripts of the supported families nest the weights, in order of preference: the
# trained weights first, an EMA copy only when a file holds nothing else.
WRAPPER_KEYS = ('state_dict', 'model', 'model_state', 'model_state_dict', 'module', 'state_dict_ema', 'model_ema')


class CheckpointMismatchError(RuntimeError):
    """A checkpoint does not cover the model it is loaded into."""


def register_family(family: str, is_mm: Callable[[Set[str]], bool], keep: Tuple[str, ...] = ('head.', ),
                    convert: Optional[Converter] = None) -> None:
    """Make ``family``'s checkpoints loadable: ``is_mm`` recognises the family's own backbone keys (an mmvisatt
    file, with or without the ``backbone.`` prefix); ``keep`` are the prefixes of the other entries such a file
    carries over (the classifier's ``head.``, RMT's ``neck.``); ``convert`` maps the family's foreign layouts
    (official, timm), where it has any."""
    _CONVERTERS[family] = _Family(convert, is_mm, tuple(keep))


def register_converter(family: str, is_mm: Callable[[Set[str]], bool],
                       keep: Tuple[str, ...] = ('head.', )) -> Callable[[Converter], Converter]:
    """:func:`register_family` as a decorator of the family's key map for :func:`convert_state_dict` and the
    converter tool."""

    def wrap(fn: Converter) -> Converter:
        register_family(family, is_mm, keep, fn)
        return fn

    return wrap


def _convert(spec: _Family, state_dict: Mapping[str, torch.Tensor]) -> Optional[Tuple[StateDict, str]]:
    """The prologue every family shares: split the ``backbone.`` envelope, keep an mmvisatt file as it is, and
    hand anything else to the family's key map."""
    prefixed = any(k.startswith('backbone.') for k in state_dict)
    if prefixed:
        inner = {k[len('backbone.'):]: v for k, v in state_dict.items() if k.startswith('backbone.')}
    else:
        inner = {k: v for k, v in state_dict.items() if not k.startswith(spec.keep)}
    if spec.is_mm(set(inner)):
        kept = {k: v for k, v in state_dict.items() if k.startswith(spec.keep)}
        return {**{'backbone.' + k: v for k, v in inner.items()}, **kept}, 'mmvisatt'
    if spec.convert is None:
        return None
    return spec.convert(inner if prefixed else dict(state_dict), prefixed)


def registered_families() -> List[str]:
    return sorted(_CONVERTERS)


class NotACheckpointError(ValueError):
    """The file is not a PyTorch checkpoint at all (empty, a web page, a git-lfs pointer, other text)."""


def file_head(path: str) -> bytes:
    """The first 512 bytes of ``path``: enough for :func:`not_a_checkpoint` to tell what the file is."""
    with open(path, 'rb') as f:
        return f.read(512)


def not_a_checkpoint(path: str, head: Optional[bytes] = None) -> Optional[str]:
    """What the local file ``path`` is when it is not a checkpoint, with the fix; None for a ``torch.save`` zip
    archive, a legacy pickle and anything else a loader may know (e.g. safetensors). ``head``: the file's
    :func:`file_head` when the caller has read it already."""
    if head is None:
        head = file_head(path)
    if not head:
        return 'an empty file (0 bytes): the download or copy did not finish. Download or copy it again'
    if head.startswith(b'PK\x03\x04') or head[:1] == b'\x80':
        return None
    text = head.lstrip().lower()
    if text.startswith(b'version https://git-lfs'):
        return (f'a git-lfs pointer ({osp.getsize(path)} bytes of text naming the real file), not the file: run '
                '`git lfs pull` in the repository it came from, or download the file itself')
    if text.startswith((b'<!doctype html', b'<html', b'<?xml', b'<head')) or b'<html' in text:
        return ('a web page (HTML), not a checkpoint: the download saved the page instead of the file (a GitHub '
                "'blob' page, a Google Drive warning or a login page). Download the file itself (GitHub: the "
                "'raw' or release-asset URL)")
    if head[8:9] == b'{' and int.from_bytes(head[:8], 'little') < 100_000_000:
        return None  # safetensors: 8-byte header length, then JSON
    if all(32 <= b < 127 or b in (9, 10, 13) for b in head):
        return f'a text file ({head[:40].decode(errors="replace").strip()!r}...), not a checkpoint'
    return (f'neither a torch.save archive nor a pickle (it starts with {head[:8]!r}): not a PyTorch checkpoint, '
            'or a damaged one. Download or copy it again')


def read_checkpoint(path: str, map_location: str = 'cpu') -> dict:
    """Read a local file, or an ``http(s)://`` URL downloaded once into the cache (:mod:`.download`); a missing
    local file or one that is no checkpoint gets an error that says how to provide it."""
    if is_url(path):
        path = download_checkpoint(path)
    elif '://' in path:  # another mmengine scheme (s3://, pavi://, ...): mmengine's loader for it
        return CheckpointLoader.load_checkpoint(path, map_location=map_location)
    path = osp.expanduser(path)
    if not osp.isfile(path):
        raise FileNotFoundError(
            f"Checkpoint '{path}' does not exist (working directory: {os.getcwd()}). Download the official "
            f"ImageNet checkpoint listed in docs/weights.md to that path, or pass another one with --cfg-options "
            f"model.backbone.init_cfg.checkpoint=PATH.")
    problem = not_a_checkpoint(path)
    if problem:
        raise NotACheckpointError(f'Checkpoint {path} is {problem}.')
    return load_checkpoint_file(path, map_location)


def unwrap_state_dict(checkpoint: Mapping) -> StateDict:
    """Take the weights out of a training checkpoint and drop DataParallel/DDP ``module.`` prefixes."""
    state = checkpoint
    while True:
        inner = next((state[k] for k in WRAPPER_KEYS if isinstance(state.get(k), Mapping)), None)
        if inner is None:
            break
        state = inner
    state = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
    if state and all(k.startswith('module.') for k in state):
        state = {k[len('module.'):]: v for k, v in state.items()}
    return state


def convert_state_dict(state_dict: Mapping[str, torch.Tensor],
                       family: Optional[str] = None) -> Tuple[StateDict, str, str]:
    """Convert any supported layout to mm-style keys; returns (state_dict, family, layout)."""
    families = [family] if family else registered_families()
    for name in families:
        if name not in _CONVERTERS:
            raise KeyError(f"Unknown checkpoint family '{name}'; known: {', '.join(registered_families())}")
        converted = _convert(_CONVERTERS[name], state_dict)
        if converted is not None:
            return converted[0], name, converted[1]
    sample = ', '.join(list(state_dict)[:8])
    raise CheckpointMismatchError(
        f"Checkpoint layout not recognised as {' or '.join(families)} (first keys: {sample}). Supported are the "
        f"official release files, timm checkpoints where the family has a timm model, and mm-style files with "
        f"'backbone.' keys.")


@dataclass
class LoadReport:
    """What a load did, for the log and for tests."""
    source: str
    layout: str
    loaded: List[str] = field(default_factory=list)
    missing: List[str] = field(default_factory=list)
    unexpected: List[str] = field(default_factory=list)

    def summary(self) -> str:
        text = (f'Loaded {self.source} ({self.layout} layout): {len(self.loaded)} tensors matched, '
                f'{len(self.missing)} newly initialised')
        if self.missing:
            text += f' [{abbreviate(self.missing)}]'
        text += f', {len(self.unexpected)} ignored'
        if self.unexpected:
            text += f' [{abbreviate(self.unexpected)}]'
        return text


def abbreviate(items: Sequence[Any], limit: int = 8) -> str:
    """The first ``limit`` of ``items``, comma-separated, and how many more there are: for messages."""
    shown = ', '.join(str(i) for i in list(items)[:limit])
    return shown + (f', ... (+{len(items) - limit})' if len(items) > limit else '')


def _matches(key: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(key, p) for p in patterns)


_INDEX = re.compile(r'\.\d+(?=\.|$)')


def deeper_model_keys(unexpected: Iterable[str], own: Iterable[str]) -> List[str]:
    """The ``unexpected`` keys that name more of the module's own repeated parts (``stages.2.blocks.7.*`` for a
    module whose ``stages.2.blocks.0.*`` exist): the checkpoint is of a deeper variant of the architecture."""
    shapes = {_INDEX.sub('.#', k) for k in own}
    return [k for k in unexpected if _INDEX.sub('.#', k) in shapes]


def load_into(module: torch.nn.Module, state_dict: Mapping[str, torch.Tensor], *, source: str, layout: str,
              allow_missing: Iterable[str] = ()) -> LoadReport:
    """Load ``state_dict`` into ``module``, raising if keys the module needs are absent or misshapen.

    ``allow_missing`` holds fnmatch patterns of keys a foreign checkpoint cannot have (documented extras).
    """
    allow_missing = tuple(allow_missing)
    own = module.state_dict()
    report = LoadReport(source=source, layout=layout)
    report.unexpected = [k for k in state_dict if k not in own]
    candidates = {k: v for k, v in state_dict.items() if k in own}
    # Shapes are judged by load_state_dict itself, after the modules' own hooks had their say (e.g. resizing
    # relative-position tables trained at another window size).
    try:
        result = module.load_state_dict(candidates, strict=False)
        wrong_shape = []
    except RuntimeError as err:
        wrong_shape = [line.strip() for line in str(err).splitlines() if 'size mismatch' in line]
        if not wrong_shape:
            raise
        result = None
    report.missing = list(result.missing_keys) if result is not None else [k for k in own if k not in candidates]
    report.loaded = sorted(k for k in candidates if k not in report.missing)
    required = [k for k in report.missing if not _matches(k, allow_missing)]
    deeper = deeper_model_keys(report.unexpected, own)
    if wrong_shape or required or deeper:
        problems = []
        if deeper:
            problems.append(f'the checkpoint has {len(deeper)} tensors of blocks or stages the model does not have '
                            f'({abbreviate(deeper, 4)}), so it is of a deeper variant (e.g. a Swin-S file for a '
                            f'Swin-T arch)')
        if required:
            problems.append(f'{len(required)} of {len(own)} tensors of {type(module).__name__} are missing from '
                            f'the checkpoint: {abbreviate(required, 20)}')
        if wrong_shape:
            problems.append(f'{len(wrong_shape)} tensors have another shape: {abbreviate(wrong_shape, 20)}')
        if report.unexpected and not deeper:
            problems.append(f'unused checkpoint keys: {abbreviate(report.unexpected, 20)}')
        raise CheckpointMismatchError(
            f'{source} ({layout} layout) does not fit {type(module).__name__}: ' + '; '.join(problems) +
            '. Check that the checkpoint belongs to this architecture and size (arch=...).')
    print_log(report.summary(), logger='current')
    return report


def load_pretrained(module: torch.nn.Module, checkpoint, *, family: str, prefix: str = 'backbone.',
                    allow_missing: Iterable[str] = (), source: Optional[str] = None) -> LoadReport:
    """Load a checkpoint file/URL or an in-memory state dict of any supported layout into ``module``.

    The checkpoint is converted to mm-style keys and the entries under ``prefix`` are loaded. ``source`` names a
    state dict's file in the messages (a file or URL passed as ``checkpoint`` names itself).
    """
    source = checkpoint if isinstance(checkpoint, str) else (source or 'state dict')
    raw = read_checkpoint(checkpoint) if isinstance(checkpoint, str) else checkpoint
    converted, _, layout = convert_state_dict(unwrap_state_dict(raw), family)
    own = {k[len(prefix):]: v for k, v in converted.items() if k.startswith(prefix)}
    if not own:
        raise CheckpointMismatchError(f"{source} has no '{prefix}' weights after conversion from the {layout} "
                                      f"layout (keys: {abbreviate(sorted(converted))}).")
    return load_into(module, own, source=source, layout=layout, allow_missing=allow_missing)


def convert_backbone_layout(state_dict: Mapping[str, torch.Tensor],
                            backbone_keys: Iterable[str]) -> Optional[Tuple[StateDict, str, str]]:
    """A whole model's ``state_dict`` (a detector or segmentor) whose ``backbone.`` entries are in a foreign layout,
    with those entries converted to the layout of a backbone with ``backbone_keys``; the other entries (neck,
    heads) as they are. Returns ``(state_dict, family, layout)``, or None when the backbone entries already fit or
    there are none. Raises :class:`CheckpointMismatchError` when they fit neither as they are nor converted."""
    own = set(backbone_keys)
    backbone = {k: v for k, v in state_dict.items() if k.startswith('backbone.')}
    inner = {k[len('backbone.'):] for k in backbone}
    if not inner or not own or len(own & inner) >= len(own) / 2:
        return None
    best = None
    for name, spec in _CONVERTERS.items():
        converted = _convert(spec, backbone)
        if converted is None:
            continue
        keys = {k[len('backbone.'):] for k in converted[0] if k.startswith('backbone.')}
        if best is None or len(own & keys) > best[0]:
            best = (len(own & keys), converted, name)
    if best is None or best[0] < len(own) / 2:
        raise CheckpointMismatchError(
            f'its backbone weights fit the model\'s backbone in {len(own & inner)} of {len(own)} tensors '
            f'(first keys: {abbreviate(sorted(inner), 4)}), and no converter recognises their layout: the backbone '
            f'would stay at its initialisation. Use a checkpoint of this backbone, or initialise the backbone with '
            f'model.backbone.init_cfg and drop load_from.')
    _, (converted, layout), family = best
    rest = {k: v for k, v in state_dict.items() if not k.startswith('backbone.')}
    return {**rest, **{k: v for k, v in converted.items() if k.startswith('backbone.')}}, family, layout


def convert_checkpoint_file(src: str, dst: str, family: Optional[str] = None) -> Tuple[str, str, int]:
    """Write ``src`` (any supported layout) as an mm-style ``{'state_dict': ...}`` file usable with
    ``init_cfg=dict(type='Pretrained', checkpoint=dst)`` or ``load_from``. Returns (family, layout, #tensors).
    """
    try:
        converted, family, layout = convert_state_dict(unwrap_state_dict(read_checkpoint(src)), family)
    except CheckpointMismatchError as error:
        raise CheckpointMismatchError(f'{src}: {error}') from None
    os.makedirs(osp.dirname(osp.abspath(dst)), exist_ok=True)
    torch.save({'state_dict': converted, 'meta': {'converted_from': src, 'layout': layout, 'family': family}},
               dst)
    return family, layout, len(converted)
