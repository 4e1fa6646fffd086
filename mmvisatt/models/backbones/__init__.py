from .evt import EVT
from .fan import FAN
from .revit import ReMViTv2, ReSwinTransformer, ReViT
from .rmt import RMT
from .shunted import ShuntedTransformer

__all__ = ['EVT', 'FAN', 'ReMViTv2', 'ReSwinTransformer', 'ReViT', 'RMT', 'ShuntedTransformer']
