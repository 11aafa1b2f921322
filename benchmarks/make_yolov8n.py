"""Export Ultralytics YOLOv8n (architecture from ``yolov8n.yaml``, random weights: nothing is downloaded) to ONNX
with dynamic batch, height and width, as ``yolo export format=onnx dynamic=True`` does.

IREE 3.13 fails to compile that model (``'iree_codegen.workgroup_count_hint' op failed to resolve workgroup count
hint in terms of workload ordinals``, the failure issue 27 reports); ``iree_compile_bench.py --cases yolov8n
--yolov8n PATH`` reduces it. Weights do not matter to a compile failure, so none are fetched.

Needs ``torch`` and ``ultralytics`` (not graphbisect dependencies): run it with another environment's Python, e.g.
``python -m venv yolo-venv && yolo-venv/bin/pip install torch ultralytics onnx onnxslim`` and then
``YOLO_OFFLINE=1 yolo-venv/bin/python benchmarks/make_yolov8n.py yolov8n-dynamic.onnx``.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    from ultralytics import YOLO

    out = Path(sys.argv[1]).absolute()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)  # the export is written beside the model: here
        exported = YOLO("yolov8n.yaml").export(format="onnx", imgsz=640, simplify=True, dynamic=True)
        shutil.move(exported, out)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
