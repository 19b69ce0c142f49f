"""Specs for the schema and fuzz tests: the repository's own, valid ones that reach every section, and
invalid ones that break one rule each (with a piece of the loader's message)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Every spec file shipped in the repository.
REPO_SPECS = [REPO / "tinytrain.yaml.example", *sorted((REPO / "bench").glob("*.yaml"))]

# Valid with a `net.tflite` and a `d.npz` beside them (the loader checks only the model file).
VALID = {
    "minimal": "model: {path: net.tflite}\n",
    "manual": """\
name: manual-1
model: {path: net.tflite, format: tflite}
data: {source: digits, classes: [0, 3, 5], relabel: false, test_fraction: 0.25, split_seed: 4}
train:
  update:
    scheme: manual
    layers:
      conv1: {bias: true, weight_ratio: 1/8}
      "#5": {weight_ratio: 0.5}
      7: {bias: true}
      fc: {weight_ratio: 1}
  optimizer: {kind: momentum, momentum: 0.5}
  batch_size: 4
  epochs: 3
  learning_rate: 1e-3
  max_train_samples: 100
  gate: {enabled: false, min_delta: -1.5}
  qas: {rounding: stochastic, master_copy: true}
  reorder: {enabled: false}
target: {board: m4-256k, kernels: dsp, cflags: [-O2], timeout_s: 30}
build: {out_dir: out, cache_dir: .cache, salt: "2", remote_cache: {url: "http://cache:8080/tt", write: true}}
""",
    "auto": """\
model: {path: net.tflite}
data: {source: npz, path: d.npz, scale: 0.5, offset: -1}
quantize: {calibration: percentile, percentile: 99.9, num_samples: 10, seed: 3, per_channel: false, io: float,
           eval_samples: 5}
train:
  update:
    scheme: auto
    budget_kb: 96.5
    search: evolutionary
    analysis: {samples: 8, eval_samples: 8, steps: 4, learning_rate: 0.05, seed: 1, max_layers: 3}
  optimizer: {kind: adam, beta1: 0.8, beta2: 0.99, eps: 1.0e-6}
target: {board: stm32f746-disco}
""",
    "last_k": "model: {path: net.tflite}\n"
              "train: {update: {scheme: last_k, k: 2}, optimizer: {kind: rmsprop, rho: 0.5}}\n",
    "bias_only": "model: {path: net.tflite}\ndata: null\ntrain: {update: {scheme: bias_only, k: 1}}\n",
    "regression": "model: {path: net.tflite}\ndata: {source: npz, path: d.npz, task: regression}\n",
    "regression-mse": "model: {path: net.tflite}\ndata: {source: npz, path: d.npz, task: regression}\n"
                      "train: {loss: mse}\n",
    "images": "model: {path: net.tflite}\ndata: {source: images, path: imgs, image_size: [32, 24], grayscale: false}\n",
    "anchors": "model: &m {path: net.tflite}\nquantize: &q {num_samples: 20}\ntrain:\n"
               "  qas: {<<: {enabled: false}, rounding: nearest}\n",
}

# Each breaks one rule; the loader's message holds the text given.
INVALID = {
    "unknown key": ("model: {path: net.tflite}\ntrian: {}\n", "unknown key 'trian'"),
    "bad choice": ("model: {path: net.tflite}\ntrain: {optimizer: {kind: adamw}}\n", "is not one of"),
    "epochs 0": ("model: {path: net.tflite}\ntrain: {epochs: 0}\n", "train.epochs"),
    "epochs yes": ("model: {path: net.tflite}\ntrain: {epochs: yes}\n", "should be a valid integer"),
    "epochs huge": ("model: {path: net.tflite}\ntrain: {epochs: 99999999999999999999999}\n", "does not fit"),
    "epochs text": ("model: {path: net.tflite}\ntrain: {epochs: '2'}\n", "should be a valid integer"),
    "lr text": ("model: {path: net.tflite}\ntrain: {learning_rate: '0.01'}\n", "should be a valid number"),
    "lr inf": ("model: {path: net.tflite}\ntrain: {learning_rate: .inf}\n", "finite"),
    "lr f32": ("model: {path: net.tflite}\ntrain: {learning_rate: 1.0e39}\n", "does not fit"),
    "lr 0": ("model: {path: net.tflite}\ntrain: {learning_rate: 0}\n", "greater than 0"),
    "seed -1": ("model: {path: net.tflite}\nquantize: {seed: -1}\n", "quantize.seed"),
    "bool 1": ("model: {path: net.tflite}\nquantize: {enabled: 1}\n", "should be a valid boolean"),
    "ratio 1/3": ("model: {path: net.tflite}\ntrain: {update: {scheme: manual, layers: {a: {weight_ratio: 1/3}}}}\n",
                  "is not one of"),
    "ratio text": ("model: {path: net.tflite}\n"
                   "train: {update: {scheme: manual, layers: {a: {weight_ratio: '0.125'}}}}\n",
                   "is not one of"),
    "ratio 0.3": ("model: {path: net.tflite}\ntrain: {update: {scheme: manual, layers: {a: {weight_ratio: 0.3}}}}\n",
                  "is not one of"),
    "last_k no k": ("model: {path: net.tflite}\ntrain: {update: {scheme: last_k}}\n", "needs k"),
    "last_k null k": ("model: {path: net.tflite}\ntrain: {update: {scheme: last_k, k: null}}\n", "needs k"),
    "manual no layers": ("model: {path: net.tflite}\ntrain: {update: {scheme: manual}}\n", "needs `layers`"),
    "manual empty": ("model: {path: net.tflite}\ntrain: {update: {scheme: manual, layers: {}}}\n", "needs `layers`"),
    "layers for auto": ("model: {path: net.tflite}\ntrain: {update: {layers: {a: {bias: true}}}}\n",
                        "only applies to scheme manual"),
    "k for full": ("model: {path: net.tflite}\ntrain: {update: {scheme: full, k: 2}}\n", "does not apply"),
    "k for auto": ("model: {path: net.tflite}\ntrain: {update: {k: 2}}\n", "does not apply"),
    "digits with path": ("model: {path: net.tflite}\ndata: {source: digits, path: d.npz}\n", "takes no path"),
    "npz without path": ("model: {path: net.tflite}\ndata: {source: npz}\n", "needs `path`"),
    "npz null path": ("model: {path: net.tflite}\ndata: {source: npz, path: null}\n", "needs `path`"),
    "image_size npz": ("model: {path: net.tflite}\ndata: {source: npz, path: d.npz, image_size: [8, 8]}\n",
                       "only applies to source 'images'"),
    "image_size 0": ("model: {path: net.tflite}\ndata: {source: images, path: i, image_size: [0, 8]}\n",
                     "two positive integers"),
    "image_size 3": ("model: {path: net.tflite}\ndata: {source: images, path: i, image_size: [8, 8, 8]}\n",
                     "data.image_size"),
    "regression digits": ("model: {path: net.tflite}\ndata: {source: digits, task: regression}\n",
                          "needs source 'npz'"),
    "regression classes": ("model: {path: net.tflite}\ndata: {source: npz, path: d.npz, task: regression, "
                           "classes: [1]}\n", "do not apply to task 'regression'"),
    "regression relabel": ("model: {path: net.tflite}\ndata: {source: npz, path: d.npz, task: regression, "
                           "relabel: false}\n", "do not apply to task 'regression'"),
    "classes empty": ("model: {path: net.tflite}\ndata: {source: digits, classes: []}\n", "classes is empty"),
    "classes twice": ("model: {path: net.tflite}\ndata: {source: digits, classes: [1, 2, 1]}\n", "more than once"),
    "classes negative": ("model: {path: net.tflite}\ndata: {source: digits, classes: [-1]}\n", "data.classes"),
    "fraction 1": ("model: {path: net.tflite}\ndata: {source: digits, test_fraction: 1.0}\n", "strictly between"),
    "scale 0": ("model: {path: net.tflite}\ndata: {source: npz, path: d.npz, scale: 0}\n", "non-zero"),
    "percentile 50": ("model: {path: net.tflite}\nquantize: {percentile: 50}\n", "greater than 50"),
    "name space": ("model: {path: net.tflite}\nname: 'my build'\n", "must be letters"),
    "name number": ("model: {path: net.tflite}\nname: 12\n", "should be a valid string"),
    "url ftp": ("model: {path: net.tflite}\nbuild: {remote_cache: {url: 'ftp://x'}}\n", "must start with http"),
    "mse for labels": ("model: {path: net.tflite}\ndata: {source: digits}\ntrain: {loss: mse}\n",
                       "train.loss is mse but data.task is classification"),
    "ce for regression": ("model: {path: net.tflite}\ndata: {source: npz, path: d.npz, task: regression}\n"
                          "train: {loss: cross_entropy}\n", "regression trains with train.loss: mse"),
    "no model": ("train: {epochs: 2}\n", "model: required key is missing"),
    "null section": ("model: {path: net.tflite}\ntrain:\n", "train"),
    "a list": ("- model\n", "must be a mapping"),
    "cflags text": ("model: {path: net.tflite}\ntarget: {cflags: -O2}\n", "target.cflags"),
    "timeout 0": ("model: {path: net.tflite}\ntarget: {timeout_s: 0}\n", "greater than 0"),
    "budget -1": ("model: {path: net.tflite}\ntrain: {update: {budget_kb: -1}}\n", "greater than 0"),
    "board": ("model: {path: net.tflite}\ntarget: {board: mps2-an386-m4}\n", "is not one of"),
    "path number": ("model: {path: 5}\n", "model.path"),
}


def project(folder: Path) -> Path:
    """The files the VALID specs name, in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "net.tflite").write_bytes(b"model")
    (folder / "d.npz").write_bytes(b"data")
    return folder
