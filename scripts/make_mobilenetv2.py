#!/usr/bin/env python3
"""Write a MobileNetV2-shaped ONNX model with seeded weights (edgepack's bundled default model).

    python scripts/make_mobilenetv2.py out.onnx [--width 1.0] [--resolution 224] [--classes 1000] [--seed 0]
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from edgepack.samples import write_mobilenetv2

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("output", type=Path)
parser.add_argument("--width", type=float, default=1.0)
parser.add_argument("--resolution", type=int, default=224)
parser.add_argument("--classes", type=int, default=1000)
parser.add_argument("--seed", type=int, default=0)
args = parser.parse_args()
path = write_mobilenetv2(args.output, width=args.width, resolution=args.resolution, classes=args.classes,
                         seed=args.seed)
print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB)")
