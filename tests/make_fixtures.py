"""Make the converter-built test fixtures in tests/fixtures/ (run by hand, not in CI).

    /opt/tfvenv/bin/python tests/make_fixtures.py [--only NAME ...]

Every model is built with Keras, converted with TensorFlow's own TFLite converter (the reference we did not
write) and saved as:
    <name>_float.tflite     float32
    <name>_int8.tflite      full-integer int8 (int8 input and output, representative dataset)
    <name>_f16.tflite       float16 weights (DEQUANTIZE ops in front of the float kernels)
    <name>.input.npy        a float32 sample batch in the model's input shape (batch first), so that tests
                            need no TensorFlow
plus the digits example (digits_cnn_*) and a README.md describing the files and the TF version.

Seeds are fixed; Keras and the converter are run with single-threaded TF ops so the weights come out the same.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

keras = tf.keras
layers = keras.layers

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SEED = 1234
N_REPRESENTATIVE = 64
MAX_BYTES = 150 * 1024


def _input(shape):
    # A static batch of 1: with a dynamic batch the converter lowers Flatten to SHAPE/STRIDED_SLICE/PACK
    # in front of RESHAPE, ops a microcontroller graph has no use for.
    return keras.Input(shape, batch_size=1, name="x")


def _bias():
    # Non-zero biases so the int32 bias path of every kernel is exercised (Keras defaults to zeros).
    return keras.initializers.RandomNormal(stddev=0.2, seed=SEED)


# ---- models ------------------------------------------------------------------------------------

def build_mlp():
    x = _input((16,))
    h = layers.Dense(32, activation="relu", bias_initializer=_bias())(x)
    y = layers.Dense(10, activation="softmax", bias_initializer=_bias())(h)
    return keras.Model(x, y, name="mlp")


def build_convnet():
    x = _input((16, 16, 3))
    h = layers.Conv2D(8, 3, padding="same", activation="relu6", bias_initializer=_bias())(x)
    h = layers.MaxPooling2D(2)(h)
    h = layers.Conv2D(16, 3, padding="valid", activation="relu", bias_initializer=_bias())(h)
    h = layers.AveragePooling2D(2)(h)
    h = layers.Flatten()(h)
    y = layers.Dense(10, activation="softmax", bias_initializer=_bias())(h)
    return keras.Model(x, y, name="convnet")


def build_residual():
    x = _input((8, 8, 8))
    a = layers.Conv2D(8, 1, activation="relu", bias_initializer=_bias())(x)
    # `a` feeds both the 3x3 conv and the ADD: a tensor with two consumers.
    b = layers.Conv2D(8, 3, padding="same", bias_initializer=_bias())(a)
    h = layers.Add()([a, b])
    h = layers.GlobalAveragePooling2D()(h)          # MEAN over H, W
    h = layers.ReLU()(h)                            # a standalone RELU (nothing to fuse into)
    y = layers.Dense(10, bias_initializer=_bias())(h)
    y = layers.Softmax()(y)
    return keras.Model(x, y, name="residual")


def build_dwsep():
    x = _input((16, 16, 4))
    h = layers.DepthwiseConv2D(3, strides=2, padding="same", activation="relu", bias_initializer=_bias())(x)
    h = layers.Conv2D(8, 1, bias_initializer=_bias())(h)
    h = layers.ZeroPadding2D(((1, 2), (2, 1)))(h)   # explicit, asymmetric PAD
    left = layers.Conv2D(6, 3, activation="relu", bias_initializer=_bias())(h)
    right = layers.DepthwiseConv2D(3, depth_multiplier=2, bias_initializer=_bias())(h)
    h = layers.Concatenate(axis=-1)([left, right])  # two branches with different ranges
    h = layers.ReLU(max_value=6.0)(h)
    h = layers.GlobalAveragePooling2D(keepdims=True)(h)
    y = layers.Flatten()(h)
    return keras.Model(x, y, name="dwsep")


def build_mbv2_block():
    x = _input((16, 16, 8))
    h = layers.Conv2D(48, 1, activation="relu6", bias_initializer=_bias())(x)            # expand
    h = layers.DepthwiseConv2D(3, padding="same", activation="relu6", bias_initializer=_bias())(h)
    h = layers.Conv2D(8, 1, bias_initializer=_bias())(h)                                  # project, linear
    y = layers.Add()([x, h])
    return keras.Model(x, y, name="mbv2_block")


def build_softmax_sweep():
    # Many softmax rows per sample (64 rows of 16) so that int8 inputs hit the fixed-point exp/reciprocal at
    # many points; one SOFTMAX straight on the input, one behind a FULLY_CONNECTED on a 3-D tensor.
    x = _input((64, 16))
    a = layers.Softmax(name="softmax_in")(x)
    h = layers.Dense(12, bias_initializer=_bias())(x)
    b = layers.Softmax(name="softmax_fc")(h)
    return keras.Model(x, [a, b], name="softmax_sweep")


def build_prelu_block():
    # MediaPipe's BlazeBlock in small (face_landmark, hand_recrop): PReLU after the convs and after the residual add,
    # one slope per channel (shared over H, W: a PRELU with alpha [1, 1, C]); slopes away from Keras' zeros.
    def prelu():
        return layers.PReLU(alpha_initializer=keras.initializers.RandomUniform(0.05, 0.5, seed=SEED),
                            shared_axes=[1, 2])

    x = _input((8, 8, 3))
    a = prelu()(layers.Conv2D(8, 3, padding="same", bias_initializer=_bias())(x))
    h = prelu()(layers.DepthwiseConv2D(3, padding="same", bias_initializer=_bias())(a))
    h = layers.Conv2D(8, 1, bias_initializer=_bias())(h)
    h = prelu()(layers.Add()([a, h]))
    h = layers.GlobalAveragePooling2D()(h)
    y = layers.Dense(5, activation="softmax", bias_initializer=_bias())(h)
    return keras.Model(x, y, name="prelu_block")


MODELS = {
    "mlp": build_mlp,
    "convnet": build_convnet,
    "residual": build_residual,
    "dwsep": build_dwsep,
    "mbv2_block": build_mbv2_block,
    "softmax_sweep": build_softmax_sweep,
    "prelu_block": build_prelu_block,
}


# ---- conversion --------------------------------------------------------------------------------

def _converter(model):
    return tf.lite.TFLiteConverter.from_keras_model(model)


def to_float(model) -> bytes:
    return _converter(model).convert()


def to_f16(model) -> bytes:
    conv = _converter(model)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    conv.target_spec.supported_types = [tf.float16]
    return conv.convert()


def to_int8(model, rep: np.ndarray, *, int8_io: bool = True) -> bytes:
    conv = _converter(model)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]

    def representative():
        for i in range(rep.shape[0]):
            yield [rep[i:i + 1].astype(np.float32)]

    conv.representative_dataset = representative
    conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    if int8_io:
        conv.inference_input_type = tf.int8
        conv.inference_output_type = tf.int8
    return conv.convert()


def _write(name: str, data: bytes) -> None:
    if len(data) > MAX_BYTES:
        raise SystemExit(f"{name} is {len(data)} bytes, over the {MAX_BYTES}-byte fixture limit")
    (FIXTURES / name).write_bytes(data)
    print(f"  {name:32s} {len(data):7d} bytes")


def _ops(data: bytes) -> list[str]:
    interp = tf.lite.Interpreter(model_content=data)
    return sorted({d["op_name"] for d in interp._get_ops_details()})


def _fresh(seed: int = SEED) -> None:
    # Layer names (and so tensor names in the file) count up per Keras session: reset it so that a model's bytes
    # do not depend on which models were built before it in this process (--only vs all).
    keras.backend.clear_session()
    keras.utils.set_random_seed(seed)


def make_model(name: str) -> dict:
    _fresh()
    model = MODELS[name]()
    rng = np.random.default_rng(SEED)
    shape = tuple(model.input_shape[1:])
    rep = rng.normal(0.0, 1.0, size=(N_REPRESENTATIVE,) + shape).astype(np.float32)
    sample = rng.normal(0.0, 1.0, size=(4,) + shape).astype(np.float32)
    np.save(FIXTURES / f"{name}.input.npy", sample)
    files = {}
    for suffix, data in (("float", to_float(model)), ("f16", to_f16(model)), ("int8", to_int8(model, rep))):
        fname = f"{name}_{suffix}.tflite"
        _write(fname, data)
        files[fname] = _ops(data)
    if name == "convnet":
        # Float input and output around an int8 body: gives QUANTIZE (float->int8) and DEQUANTIZE ops.
        data = to_int8(model, rep, int8_io=False)
        _write("convnet_int8_floatio.tflite", data)
        files["convnet_int8_floatio.tflite"] = _ops(data)
    return files


# ---- digits example ----------------------------------------------------------------------------

def digits_split():
    """Digits 0-4 only, scaled to [0, 1], NHWC. The split is the one the product demo documents."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    keep = d.target < 5
    x = (d.images[keep] / 16.0).astype(np.float32)[..., None]
    y = d.target[keep].astype(np.int64)
    return train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)


def _tflite_accuracy(data: bytes, x: np.ndarray, y: np.ndarray) -> float:
    interp = tf.lite.Interpreter(model_content=data)
    interp.allocate_tensors()
    inp, out = interp.get_input_details()[0], interp.get_output_details()[0]
    correct = 0
    for i in range(x.shape[0]):
        xi = x[i:i + 1]
        if inp["dtype"] == np.int8:
            s, z = inp["quantization"]
            xi = np.clip(np.round(xi / s) + z, -128, 127).astype(np.int8)
        interp.set_tensor(inp["index"], xi)
        interp.invoke()
        correct += int(np.argmax(interp.get_tensor(out["index"])[0]) == y[i])
    return correct / x.shape[0]


def make_digits() -> dict:
    _fresh()
    x_tr, x_te, y_tr, y_te = digits_split()
    x = _input((8, 8, 1))
    h = layers.Conv2D(8, 3, activation="relu")(x)
    h = layers.Conv2D(16, 3, activation="relu")(h)
    h = layers.Flatten()(h)
    out = layers.Dense(10, activation="softmax")(h)  # a 10-way head, although only 0-4 are trained
    model = keras.Model(x, out, name="digits_cnn")
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    model.fit(x_tr, y_tr, epochs=15, batch_size=32, shuffle=True, verbose=0)
    fdata = to_float(model)
    idata = to_int8(model, x_tr)
    _write("digits_cnn_float.tflite", fdata)
    _write("digits_cnn_int8.tflite", idata)
    np.save(FIXTURES / "digits_cnn.input.npy", x_te[:8].astype(np.float32))
    acc_f = _tflite_accuracy(fdata, x_te, y_te)
    acc_i = _tflite_accuracy(idata, x_te, y_te)
    info = {
        "model": "digits_cnn_float.tflite",
        "task": "sklearn load_digits, classes 0-4 only, images/16 -> [0,1], NHWC [N,8,8,1]",
        "split": "sklearn train_test_split(test_size=0.25, random_state=0, stratify=y) on the 0-4 subset",
        "n_train": int(x_tr.shape[0]), "n_test": int(x_te.shape[0]),
        "float_test_accuracy": acc_f,
        "int8_converter_test_accuracy": acc_i,
        "int8_model": "digits_cnn_int8.tflite",
        "train": {"optimizer": "adam", "lr": 1e-2, "epochs": 15, "batch_size": 32, "seed": SEED},
        "tensorflow": tf.__version__,
    }
    (FIXTURES / "digits_cnn_float.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    print(f"  digits: float acc {acc_f:.4f}, converter int8 acc {acc_i:.4f}")
    return {"digits_cnn_float.tflite": _ops(fdata), "digits_cnn_int8.tflite": _ops(idata)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", help="model names to (re)make; default all")
    args = ap.parse_args(argv)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    FIXTURES.mkdir(parents=True, exist_ok=True)
    names = args.only or list(MODELS) + ["digits_cnn"]
    ops = {}
    for name in names:
        print(name)
        ops.update(make_digits() if name == "digits_cnn" else make_model(name))
    manifest = FIXTURES / "ops.json"
    old = json.loads(manifest.read_text()) if manifest.exists() else {}
    old.update(ops)
    old["_tensorflow"] = tf.__version__
    manifest.write_text(json.dumps(old, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
