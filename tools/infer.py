"""Draw a trained model's predictions on images:
``python tools/infer.py IMAGES... CONFIG CHECKPOINT --out DIR [--score-thr 0.3] [--device cpu] [--demo]``.

IMAGES are files and/or folders; one ``<image name>.png`` per image is written to DIR (boxes, masks and class names
for detectors, a colour overlay for segmentors). The logic lives in :mod:`mmvisatt.apis.inference`.
"""
from mmvisatt.apis.inference import run_infer_tool

if __name__ == '__main__':
    run_infer_tool()
