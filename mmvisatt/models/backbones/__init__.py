from .evt import EVT
from .fan import FAN
from .fan_vit import FANViT
from .fan_hybrid import FANHybrid
from .fan_swin import FANSwin
from .reswin import ReSwinTransformer
from .revit import ReViT
from .remvit import ReMViTv2
from .rmt import RMT
from .shunted import ShuntedTransformer

__all__ = ['EVT', 'FAN', 'FANViT', 'FANHybrid', 'FANSwin', 'ReMViTv2', 'ReSwinTransformer', 'ReViT', 'RMT',
           'ShuntedTransformer']
