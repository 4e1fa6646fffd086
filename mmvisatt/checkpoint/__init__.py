from .loading import (CheckpointMismatchError, LoadReport, NotACheckpointError, convert_backbone_layout,
                      convert_checkpoint_file, convert_state_dict, deeper_model_keys, file_head, load_into,
                      load_pretrained, not_a_checkpoint, read_checkpoint, register_converter, registered_families,
                      unwrap_state_dict)

__all__ = [
    'CheckpointMismatchError', 'LoadReport', 'NotACheckpointError', 'convert_backbone_layout',
    'convert_checkpoint_file', 'convert_state_dict', 'deeper_model_keys', 'file_head',
    'load_into', 'load_pretrained', 'not_a_checkpoint', 'read_checkpoint', 'register_converter',
    'registered_families', 'unwrap_state_dict'
]
