"""Make the zoo models in stages/model/zoo_models/ with TensorFlow's own converter (run by hand, not in CI).

    /opt/tfvenv/bin/python tests/make_zoo.py          # ~4 minutes on one CPU core

    mbv2_w035_128_int8.tflite    MobileNetV2 width 0.35, 128x128x3 input, 10 classes, full-integer int8
                                 (int8 input and output), pretrained on a synthetic task (below)
    mbv2_w035_128_float.tflite   the same network in float32 (written only if under 1.5 MB)
    mbv2_w035_128.json           how it was made, with which TensorFlow, its accuracy, op counts, sizes

This is the network of MIT's Tiny Training Engine paper (MobileNetV2-w0.35 @128, 141 KB peak training memory),
so that our memory figures can be put next to theirs. There is no network access here, so no ImageNet weights:
a seeded random init is "dead" as a starting point for on-device training (with BatchNorm at its defaults the
ReLU6 outputs collapse, Conv_1 sits at its zero point for every input, every gradient is zero). So the network is
pretrained briefly on the procedural 10-class task of bench/synth_images.py (oriented gratings in a warm or cool
colour family), then converted with the real converter, the representative dataset being pretraining images.
The device benchmark (bench/mbv2_tte.yaml) fine-tunes it on the *shifted* domain of the same generator (hues
rotated, dimmer), which the pretrained network only half gets right, so on-device training has work to do.

Shapes (hence every memory figure) are those of the untrained network: same Keras constructor, batch 1, and the
classifier's bias is kept at zero (not trained) because the converter drops an all-zero bias; a non-zero one
would give the FULLY_CONNECTED a bias input and change which layers the TTE-like scheme's "last 22 biases" are.

Keras and the converter run single-threaded with fixed seeds and op determinism, so the bytes come out the same
on a rerun with the same TensorFlow.
"""

from __future__ import annotations

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

keras = tf.keras

REPO = Path(__file__).resolve().parents[1]
ZOO = REPO / "stages" / "model" / "zoo_models"
sys.path.insert(0, str(REPO / "bench"))
import synth_images  # noqa: E402

SEED = 1234
N_TRAIN = 3000        # pretraining images (source domain), balanced over the 10 classes
N_VAL = 500           # held-out source images for the accuracy figure; as many from the shifted domain
EPOCHS = 3            # ~50 images/s on one core: ~3 minutes of training
BATCH = 32
LR = 2e-3
BN_MOMENTUM = 0.9     # Keras' MobileNetV2 uses 0.999: its moving statistics would hardly move in ~300 steps
N_REPRESENTATIVE = 64
FLOAT_LIMIT = 1_500_000  # keep the repository small: the float model is a convenience, not a requirement


def build_mbv2(batch: int | None = 1, size: int = 128) -> keras.Model:
    keras.utils.set_random_seed(SEED)
    # A static batch of 1 for the converted model (a microcontroller runs one sample at a time; a dynamic batch
    # makes the converter add shape arithmetic ops in front of the classifier); None to train with batches.
    x = keras.Input((size, size, 3), batch_size=batch, name="x")
    return keras.applications.MobileNetV2(input_tensor=x, alpha=0.35, weights=None, classes=10,
                                          classifier_activation="softmax")


def dataset(n: int, seed: int, domain: str) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.permutation(np.arange(n) % synth_images.CLASSES)
    return synth_images.to_model_input(synth_images.images(y, rng, domain)), y.astype(np.int64)


def pretrain(model: keras.Model, x: np.ndarray, y: np.ndarray, epochs: int = EPOCHS) -> list[float]:
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.momentum = BN_MOMENTUM
    model.get_layer("predictions").bias.trainable = False   # stays 0: see the module docstring
    steps = epochs * (len(x) // BATCH)
    sched = keras.optimizers.schedules.CosineDecay(LR, steps, alpha=0.05)
    model.compile(keras.optimizers.Adam(sched), "sparse_categorical_crossentropy", metrics=["accuracy"])
    hist = model.fit(x, y, batch_size=BATCH, epochs=epochs, shuffle=True, verbose=2)
    return [float(a) for a in hist.history["accuracy"]]


def to_int8(model: keras.Model, rep: np.ndarray) -> bytes:
    conv = tf.lite.TFLiteConverter.from_keras_model(model)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]

    def representative():
        for i in range(rep.shape[0]):
            yield [rep[i:i + 1]]

    conv.representative_dataset = representative
    conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    conv.inference_input_type = tf.int8
    conv.inference_output_type = tf.int8
    return conv.convert()


def to_float(model: keras.Model) -> bytes:
    return tf.lite.TFLiteConverter.from_keras_model(model).convert()


def tflite_accuracy(data: bytes, x: np.ndarray, y: np.ndarray) -> float:
    interp = tf.lite.Interpreter(model_content=data, num_threads=1)
    interp.allocate_tensors()
    inp, out = interp.get_input_details()[0], interp.get_output_details()[0]
    s, z = inp["quantization"]
    hits = 0
    for i in range(len(x)):
        q = x[i:i + 1]
        if inp["dtype"] == np.int8:   # a full-integer file; a float file takes the images as they are
            q = np.clip(np.round(q / s) + z, -128, 127).astype(np.int8)
        interp.set_tensor(inp["index"], q)
        interp.invoke()
        hits += int(np.argmax(interp.get_tensor(out["index"])[0]) == y[i])
    return hits / len(x)


def op_counts(data: bytes) -> dict[str, int]:
    interp = tf.lite.Interpreter(model_content=data)
    out: dict[str, int] = {}
    for d in interp._get_ops_details():
        out[d["op_name"]] = out.get(d["op_name"], 0) + 1
    return dict(sorted(out.items()))


def main() -> None:
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.experimental.enable_op_determinism()
    ZOO.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    x_tr, y_tr = dataset(N_TRAIN, SEED, "source")
    x_va, y_va = dataset(N_VAL, SEED + 1, "source")
    x_sh, y_sh = dataset(N_VAL, SEED + 2, "shifted")
    trainer = build_mbv2(batch=None)
    train_acc = pretrain(trainer, x_tr, y_tr)
    # The converted model has a static batch of 1: the same constructor, the trained weights copied over.
    model = build_mbv2(batch=1)
    model.set_weights(trainer.get_weights())
    float_val = float(trainer.evaluate(x_va, y_va, batch_size=50, verbose=0)[1])   # same weights, compiled
    float_sh = float(trainer.evaluate(x_sh, y_sh, batch_size=50, verbose=0)[1])
    int8 = to_int8(model, x_tr[:N_REPRESENTATIVE])
    (ZOO / "mbv2_w035_128_int8.tflite").write_bytes(int8)
    int8_val, int8_sh = tflite_accuracy(int8, x_va, y_va), tflite_accuracy(int8, x_sh, y_sh)
    info = {"model": "keras.applications.MobileNetV2(input_shape=(128,128,3), alpha=0.35, weights=None, "
                     "classes=10), batch 1",
            "weights": (f"pretrained from a seeded random init (seed {SEED}) on bench/synth_images.py's source "
                        f"domain: {N_TRAIN} images, {EPOCHS} epochs, batch {BATCH}, Adam {LR} cosine-decayed, "
                        f"BatchNorm momentum {BN_MOMENTUM}, classifier bias frozen at 0"),
            "pretraining_task": "10 classes = 5 grating orientations x 2 hue families (warm, cool); "
                                "bench/synth_images.py, domain 'source'",
            "accuracy": {"train_last_epoch_float": round(train_acc[-1], 4),
                         "source_heldout_float": round(float_val, 4), "source_heldout_int8": round(int8_val, 4),
                         "shifted_float": round(float_sh, 4), "shifted_int8": round(int8_sh, 4),
                         "heldout_samples": N_VAL,
                         "note": "'shifted' is the fine-tuning domain of bench/make_mbv2_data.py (hues rotated "
                                 f"{synth_images.HUE_SHIFT:g} degrees, dimmer) before any fine-tuning"},
            "tensorflow": tf.__version__,
            "representative_dataset": f"the first {N_REPRESENTATIVE} pretraining images",
            "params": int(model.count_params()),
            "files": {"mbv2_w035_128_int8.tflite": {"bytes": len(int8), "ops": op_counts(int8)}}}
    flt = to_float(model)
    if len(flt) < FLOAT_LIMIT:
        (ZOO / "mbv2_w035_128_float.tflite").write_bytes(flt)
        info["files"]["mbv2_w035_128_float.tflite"] = {"bytes": len(flt), "ops": op_counts(flt)}
    else:
        info["float_skipped"] = f"float model is {len(flt)} bytes (limit {FLOAT_LIMIT})"
    (ZOO / "mbv2_w035_128.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    print(json.dumps(info, indent=2, sort_keys=True))
    print(f"made in {time.time() - t0:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
