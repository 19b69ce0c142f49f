"""Converter-made MobileNetV2-w0.35 files in float and at 96 px, made with TensorFlow's own converter (issue 10:
"MobileNetV2 (zoo and converter-made, float and int8, 96 and 128)"). Run under a TensorFlow environment:

    <a python with tensorflow> bench/make_mbv2_converter.py [--out DIR]     # a few minutes on one core

Writes, into DIR (default ~/.cache/tinytrain-mbv2-converter; never into the repository: a float MobileNetV2-0.35
is ~1.6 MB):
    mbv2_w035_128_float.tflite   float32, 128x128x3 input
    mbv2_w035_96_float.tflite    float32, 96x96x3 input
    mbv2_w035_96_int8.tflite     full-integer int8 (int8 input and output), 96x96x3 input
    mbv2_w035_128_int8.tflite    the same recipe at 128 (for comparison with the zoo's own int8 file)
    made.json                    the recipe, TensorFlow's version, sizes and accuracies

The recipe is tests/make_zoo.py's (the zoo's converter-made int8 128 file): keras.applications.MobileNetV2(alpha=
0.35, weights=None, classes=10), pretrained briefly on bench/synth_images.py's source domain so that BatchNorm's
statistics are sane (a seeded random init is dead for on-device training), classifier bias frozen at 0. It is
shorter here (fewer images, fewer epochs: minutes, not a faithful copy of the zoo weights) because these files are
about the converter's float and 96 px graphs, not accuracy. MobileNetV2 is fully convolutional up to its global
pooling, so one network is trained (at 128) and its weights are copied into batch-1 models built at 128 and at 96,
then converted; the 96 px int8 file's representative images are the 128 px ones resized (nearest neighbour) as
bench/mbv2_variants.py resizes the fine-tuning data.

bench/mbv2_variants.py --model DIR/mbv2_w035_96_float.tflite ... builds them with the default `scheme: auto`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
import make_zoo as zoo  # noqa: E402  (the zoo's recipe: the network, data, pretraining, converter, LiteRT top-1)

N_TRAIN = 1200        # a short pretraining: BatchNorm statistics and a network that is not dead
EPOCHS = 2
N_REPRESENTATIVE = 32
N_VAL = 200
DEFAULT_OUT = Path.home() / ".cache" / "tinytrain-mbv2-converter"


def resize(x: np.ndarray, size: int) -> np.ndarray:
    idx = (np.arange(size) * x.shape[1] / size).astype(int)
    return np.ascontiguousarray(x[:, idx][:, :, idx])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    a = ap.parse_args(argv)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.experimental.enable_op_determinism()
    a.out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    x_tr, y_tr = zoo.dataset(N_TRAIN, zoo.SEED, "source")
    x_va, y_va = zoo.dataset(N_VAL, zoo.SEED + 1, "source")
    trainer = zoo.build_mbv2(None, 128)
    train_acc = zoo.pretrain(trainer, x_tr, y_tr, EPOCHS)[-1]
    made: dict = {"recipe": f"keras MobileNetV2(alpha=0.35, weights=None, classes=10), pretrained {EPOCHS} epochs "
                            f"on {N_TRAIN} synthetic source images (seed {zoo.SEED}) at 128 px, weights copied into "
                            "batch-1 models at 128 and 96, converted by tf.lite.TFLiteConverter",
                  "tensorflow": tf.__version__, "train_accuracy_last_epoch": round(train_acc, 4), "files": {}}
    for size in (128, 96):
        model = zoo.build_mbv2(1, size)
        model.set_weights(trainer.get_weights())
        rep, xv = resize(x_tr[:N_REPRESENTATIVE], size), resize(x_va, size)
        for kind, data in (("float", zoo.to_float(model)), ("int8", zoo.to_int8(model, rep))):
            name = f"mbv2_w035_{size}_{kind}.tflite"
            (a.out / name).write_bytes(data)
            made["files"][name] = {"bytes": len(data), "heldout_top1": round(zoo.tflite_accuracy(data, xv, y_va), 4)}
            print(name, made["files"][name], flush=True)
    made["seconds"] = round(time.time() - t0, 1)
    (a.out / "made.json").write_text(json.dumps(made, indent=2, sort_keys=True) + "\n")
    print(json.dumps(made, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
