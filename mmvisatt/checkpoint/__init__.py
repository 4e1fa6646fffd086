"""Checkpoints: the one safe loader (tensors and plain data only) and the family converters.

Importing this package changes nothing outside it: :mod:`mmvisatt.engine` makes
:func:`~.safe_load.load_checkpoint_file` mmengine's loader for local files.
"""
from .download import CheckpointDownloadError, download_checkpoint, is_url, url_cache_path
from .loading import (CheckpointMismatchError, LoadReport, NotACheckpointError, convert_backbone_layout,
                      convert_checkpoint_file, convert_state_dict, deeper_model_keys, file_head, load_into,
                      load_pretrained, not_a_checkpoint, read_checkpoint, register_converter, register_family,
                      registered_families, unwrap_state_dict)
from .safe_load import (PickledRecord, UnsafeCheckpointError, allowing_stand_ins, checkpoint_globals,
                        load_checkpoint_file, register_mmengine_loader)

__all__ = [
    'CheckpointMismatchError', 'LoadReport', 'NotACheckpointError', 'convert_backbone_layout',
    'convert_checkpoint_file', 'convert_state_dict', 'deeper_model_keys', 'file_head',
    'load_into', 'load_pretrained', 'not_a_checkpoint', 'read_checkpoint', 'register_converter',
    'register_family',
    'registered_families', 'unwrap_state_dict', 'PickledRecord', 'UnsafeCheckpointError', 'allowing_stand_ins',
    'checkpoint_globals', 'download_checkpoint', 'CheckpointDownloadError', 'is_url', 'url_cache_path',
    'load_checkpoint_file', 'register_mmengine_loader'
]
