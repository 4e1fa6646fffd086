from .loading import (CheckpointMismatchError, LoadReport, convert_checkpoint_file, convert_state_dict,
                      load_into, load_pretrained, read_checkpoint, register_converter, registered_families,
                      unwrap_state_dict)

__all__ = [
    'CheckpointMismatchError', 'LoadReport', 'convert_checkpoint_file', 'convert_state_dict', 'load_into',
    'load_pretrained', 'read_checkpoint', 'register_converter', 'registered_families', 'unwrap_state_dict'
]
