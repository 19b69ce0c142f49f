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
sys.path.insert(0, str(HERE))
import synth_images  # noqa: E402

keras = tf.keras
SEED = 1234
N_TRAIN = 1200        # a short pretraining: BatchNorm statistics and a network that is not dead
EPOCHS = 2
BATCH = 32
LR = 2e-3
BN_MOMENTUM = 0.9
N_REPRESENTATIVE = 32
N_VAL = 200
DEFAULT_OUT = Path.home() / ".cache" / "tinytrain-mbv2-converter"


def build(size: int, batch: int | None) -> keras.Model:
    keras.utils.set_random_seed(SEED)
    x = keras.Input((size, size, 3), batch_size=batch, name="x")
    return keras.applications.MobileNetV2(input_tensor=x, alpha=0.35, weights=None, classes=10,
                                          classifier_activation="softmax")


def dataset(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.permutation(np.arange(n) % synth_images.CLASSES)
    return synth_images.to_model_input(synth_images.images(y, rng, "source")), y.astype(np.int64)


def resize(x: np.ndarray, size: int) -> np.ndarray:
    idx = (np.arange(size) * x.shape[1] / size).astype(int)
    return np.ascontiguousarray(x[:, idx][:, :, idx])


def pretrain(model: keras.Model, x: np.ndarray, y: np.ndarray) -> float:
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.momentum = BN_MOMENTUM
    model.get_layer("predictions").bias.trainable = False   # stays 0, as in tests/make_zoo.py
    sched = keras.optimizers.schedules.CosineDecay(LR, EPOCHS * (len(x) // BATCH), alpha=0.05)
    model.compile(keras.optimizers.Adam(sched), "sparse_categorical_crossentropy", metrics=["accuracy"])
    hist = model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=True, verbose=2)
    return float(hist.history["accuracy"][-1])


def convert(model: keras.Model, rep: np.ndarray | None) -> bytes:
    conv = tf.lite.TFLiteConverter.from_keras_model(model)
    if rep is not None:
        conv.optimizations = [tf.lite.Optimize.DEFAULT]
        conv.representative_dataset = lambda: ([rep[i:i + 1]] for i in range(rep.shape[0]))
        conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        conv.inference_input_type = tf.int8
        conv.inference_output_type = tf.int8
    return conv.convert()


def accuracy(data: bytes, x: np.ndarray, y: np.ndarray) -> float:
    """Top-1 of the converted file under LiteRT's interpreter (TensorFlow's)."""
    interp = tf.lite.Interpreter(model_content=data, num_threads=1)
    interp.allocate_tensors()
    inp, out = interp.get_input_details()[0], interp.get_output_details()[0]
    hits = 0
    for i in range(len(x)):
        v = x[i:i + 1]
        if inp["dtype"] == np.int8:
            s, z = inp["quantization"]
            v = np.clip(np.round(v / s) + z, -128, 127).astype(np.int8)
        interp.set_tensor(inp["index"], v)
        interp.invoke()
        hits += int(np.argmax(interp.get_tensor(out["index"])[0]) == y[i])
    return hits / len(x)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    a = ap.parse_args(argv)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.experimental.enable_op_determinism()
    a.out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    x_tr, y_tr = dataset(N_TRAIN, SEED)
    x_va, y_va = dataset(N_VAL, SEED + 1)
    trainer = build(128, None)
    train_acc = pretrain(trainer, x_tr, y_tr)
    made: dict = {"recipe": f"keras MobileNetV2(alpha=0.35, weights=None, classes=10), pretrained {EPOCHS} epochs "
                            f"on {N_TRAIN} synthetic source images (seed {SEED}) at 128 px, weights copied into "
                            "batch-1 models at 128 and 96, converted by tf.lite.TFLiteConverter",
                  "tensorflow": tf.__version__, "train_accuracy_last_epoch": round(train_acc, 4), "files": {}}
    for size in (128, 96):
        model = build(size, 1)
        model.set_weights(trainer.get_weights())
        rep, xv = resize(x_tr[:N_REPRESENTATIVE], size), resize(x_va, size)
        for kind, data in (("float", convert(model, None)), ("int8", convert(model, rep))):
            name = f"mbv2_w035_{size}_{kind}.tflite"
            (a.out / name).write_bytes(data)
            made["files"][name] = {"bytes": len(data), "heldout_top1": round(accuracy(data, xv, y_va), 4)}
            print(name, made["files"][name], flush=True)
    made["seconds"] = round(time.time() - t0, 1)
    (a.out / "made.json").write_text(json.dumps(made, indent=2, sort_keys=True) + "\n")
    print(json.dumps(made, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
