"""Using trained models: :mod:`.inference` runs a detector or segmentor on images and draws its predictions
(``tools/infer.py`` is its command line)."""
from .inference import (IMAGE_EXTENSIONS, InferenceError, Prediction, Predictor, check_weights_fit,
                        collect_images, inference_config, infer_main)

__all__ = ['IMAGE_EXTENSIONS', 'InferenceError', 'Prediction', 'Predictor', 'check_weights_fit', 'collect_images',
           'inference_config', 'infer_main']
