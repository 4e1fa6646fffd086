from .evt import EVT
from .fan import FAN
from .reswin import ReSwinTransformer
from .revit import ReViT
from .remvit import ReMViTv2
from .rmt import RMT
from .shunted import ShuntedTransformer

__all__ = ['EVT', 'FAN', 'ReMViTv2', 'ReSwinTransformer', 'ReViT', 'RMT', 'ShuntedTransformer']
