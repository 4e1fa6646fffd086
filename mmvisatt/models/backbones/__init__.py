from .fan import FAN
from .revit import ReMViTv2, ReSwinTransformer, ReViT
from .shunted import ShuntedTransformer

__all__ = ['FAN', 'ReMViTv2', 'ReSwinTransformer', 'ReViT', 'ShuntedTransformer']
