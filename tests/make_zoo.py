"""Make the zoo models in stages/zoo_models/ with TensorFlow's own converter (run by hand, not in CI).

    /opt/tfvenv/bin/python tests/make_zoo.py

    mbv2_w035_128_int8.tflite    MobileNetV2 width 0.35, 128x128x3 input, 10 classes, full-integer int8
                                 (int8 input and output, representative dataset of random images)
    mbv2_w035_128_float.tflite   the same network in float32 (written only if under 1.5 MB)
    mbv2_w035_128.json           what was made and with which TensorFlow, op counts, sizes

This is the network of MIT's Tiny Training Engine paper (MobileNetV2-w0.35 @128, 141 KB peak training memory),
so that our memory figures can be put next to theirs. There is no network access here, so the weights are a
seeded random init (weights=None); memory and latency do not depend on the values. Keras and the converter run
single-threaded with fixed seeds so the bytes come out the same on a rerun with the same TensorFlow.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

keras = tf.keras

ZOO = Path(__file__).resolve().parents[1] / "stages" / "zoo_models"
SEED = 1234
N_REPRESENTATIVE = 32
FLOAT_LIMIT = 1_500_000  # keep the repository small: the float model is a convenience, not a requirement


def build_mbv2() -> keras.Model:
    keras.utils.set_random_seed(SEED)
    # A static batch of 1 (a microcontroller runs one sample at a time; a dynamic batch makes the converter add
    # shape arithmetic ops in front of the classifier).
    x = keras.Input((128, 128, 3), batch_size=1, name="x")
    return keras.applications.MobileNetV2(input_tensor=x, alpha=0.35, weights=None, classes=10,
                                          classifier_activation="softmax")


def representative_images(n: int) -> np.ndarray:
    # MobileNetV2 expects inputs in [-1, 1] (keras.applications.mobilenet_v2.preprocess_input).
    rng = np.random.default_rng(SEED)
    return rng.uniform(-1.0, 1.0, size=(n, 128, 128, 3)).astype(np.float32)


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


def op_counts(data: bytes) -> dict[str, int]:
    interp = tf.lite.Interpreter(model_content=data)
    out: dict[str, int] = {}
    for d in interp._get_ops_details():
        out[d["op_name"]] = out.get(d["op_name"], 0) + 1
    return dict(sorted(out.items()))


def main() -> None:
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    ZOO.mkdir(parents=True, exist_ok=True)
    model = build_mbv2()
    rep = representative_images(N_REPRESENTATIVE)
    int8 = to_int8(model, rep)
    (ZOO / "mbv2_w035_128_int8.tflite").write_bytes(int8)
    info = {"model": "keras.applications.MobileNetV2(input_shape=(128,128,3), alpha=0.35, weights=None, "
                     "classes=10), batch 1",
            "weights": f"random init, seed {SEED} (no pretrained weights: memory/latency work only)",
            "tensorflow": tf.__version__, "representative_dataset": f"{N_REPRESENTATIVE} uniform[-1,1] images",
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


if __name__ == "__main__":
    main()
