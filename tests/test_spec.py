"""The YAML spec: every error names its line and path; paths resolve against the YAML's folder;
file-valued fields enter cache keys by content."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tinytrain.pipeline.errors import SpecError, UserError
from tinytrain.pipeline.preimage import slice_preimage, stage_preimage
from tinytrain.pipeline.spec import Spec, default_name, json_schema, load_spec
from tinytrain.pipeline.stage_graph import STAGES

REPO = Path(__file__).resolve().parents[1]


def _spec(tmp_path: Path, text: str, name: str = "tinytrain.yaml") -> Path:
    (tmp_path / "net.tflite").write_bytes(b"model")
    path = tmp_path / name
    path.write_text(text)
    return path


def _error(path: Path) -> str:
    with pytest.raises(SpecError) as e:
        load_spec(path)
    assert e.value.exit_code == 2
    return str(e.value)


def test_minimal_spec_gets_defaults_and_a_name_from_the_file(tmp_path):
    spec = load_spec(_spec(tmp_path, "model: {path: net.tflite}\n", "digits.yaml.example"))
    assert spec.name == "digits"
    assert spec.model.path == tmp_path / "net.tflite"
    assert spec.train.optimizer.kind == "sgd" and spec.train.update.scheme == "auto"
    assert spec.build.out_dir == tmp_path / "build"
    assert spec.source == tmp_path / "digits.yaml.example"


@pytest.mark.parametrize("file, expected", [("tinytrain.yaml", "tinytrain"), ("a b.yml", "a-b"),
                                            ("x.yaml.example", "x"), (".yaml", "yaml")])
def test_default_name(file, expected):
    assert default_name(Path(file)) == expected


def test_malformed_yaml_reports_line_and_column(tmp_path):
    msg = _error(_spec(tmp_path, "model:\n  path: [net.tflite\ntrain: {}\n"))
    assert msg.startswith(f"{tmp_path / 'tinytrain.yaml'}:3:")
    assert "malformed YAML" in msg


def test_unknown_key_suggests_the_close_one_with_its_line(tmp_path):
    msg = _error(_spec(tmp_path, "model:\n  path: net.tflite\ntrain:\n  epochs: 2\n  optimiser:\n    kind: sgd\n"))
    assert msg == f"{tmp_path / 'tinytrain.yaml'}:5: train.optimiser: unknown key 'optimiser'; did you mean 'optimizer'?"


def test_unknown_key_without_a_close_match_lists_the_allowed_ones(tmp_path):
    msg = _error(_spec(tmp_path, "model: {path: net.tflite}\ntarget: {colour: red}\n"))
    assert ":2: target.colour: unknown key 'colour'; allowed keys: board, kernels, cflags, timeout_s" in msg


def test_wrong_choice_lists_the_choices(tmp_path):
    text = "model: {path: net.tflite}\n\n\n\n\ntrain:\n  optimizer:\n    kind: adamw\n"
    msg = _error(_spec(tmp_path, text))
    assert msg.endswith("tinytrain.yaml:8: train.optimizer.kind: 'adamw' is not one of sgd, momentum, adam, rmsprop")


def test_wrong_type_names_path_and_line(tmp_path):
    msg = _error(_spec(tmp_path, "model: {path: net.tflite}\ntrain:\n  batch_size: many\n"))
    assert ":3: train.batch_size: should be a valid integer" in msg and "'many'" in msg


def test_errors_in_nested_maps_and_lists_are_located(tmp_path):
    text = ("model: {path: net.tflite}\ntrain:\n  update:\n    scheme: manual\n    layers:\n"
            "      conv1: {bias: true, weight_ratio: 1/3}\ntarget:\n  cflags: [-O2, 3.5]\n")
    msg = _error(_spec(tmp_path, text))
    assert ":6: train.update.layers.conv1.weight_ratio: weight_ratio 1/3 is not one of 0, 1/8, 1/4, 1/2, 1" in msg
    assert ":8: target.cflags[1]: should be a valid string" in msg


def test_several_errors_are_all_reported_in_file_order(tmp_path):
    msg = _error(_spec(tmp_path, "model: {path: net.tflite}\ntrain: {epochs: 0}\ntarget: {board: pc}\n"))
    lines = msg.splitlines()
    assert len(lines) == 2 and ":2: train.epochs:" in lines[0] and ":3: target.board:" in lines[1]


def test_missing_model_file_is_a_clear_error(tmp_path):
    msg = _error(_spec(tmp_path, "model:\n  path: models/missing.tflite\n"))
    assert msg == f"{tmp_path / 'tinytrain.yaml'}:2: model.path: file not found: {tmp_path / 'models/missing.tflite'}"


def test_missing_required_section(tmp_path):
    msg = _error(_spec(tmp_path, "train: {epochs: 2}\n"))
    assert msg == f"{tmp_path / 'tinytrain.yaml'}:1: model: required key is missing"


def test_duplicate_key_is_an_error(tmp_path):
    msg = _error(_spec(tmp_path, "model: {path: net.tflite}\ntrain: {epochs: 1}\ntrain: {epochs: 2}\n"))
    assert ":3: key 'train' appears twice (first on line 2)" in msg


@pytest.mark.parametrize("text, message", [
    ("", "model: required key is missing"),
    ("- a\n- b\n", "the spec must be a mapping"),
    ("model: {path: net.tflite}\nname: 'my build'\n", "name 'my build' must be letters"),
    ("model: {path: net.tflite}\ntrain: {update: {scheme: last_k}}\n", "scheme last_k needs k"),
    ("model: {path: net.tflite}\nbuild: {remote_cache: {url: 'ftp://x'}}\n", "url must start with http"),
])
def test_other_invalid_specs(tmp_path, text, message):
    assert message in _error(_spec(tmp_path, text))


def test_missing_spec_file(tmp_path):
    assert "spec file not found" in _error(tmp_path / "nope.yaml")


def test_relative_paths_resolve_against_the_yaml_folder_not_the_cwd(tmp_path, monkeypatch):
    proj = tmp_path / "proj"
    (proj / "models").mkdir(parents=True)
    (proj / "models" / "net.tflite").write_bytes(b"m")
    (proj / "data.npz").write_bytes(b"d")
    (proj / "spec.yaml").write_text("model: {path: models/net.tflite}\ndata: {source: npz, path: data.npz}\n"
                                    "build: {out_dir: ../out, cache_dir: .cache}\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    spec = load_spec(Path("../proj/spec.yaml"))
    assert spec.model.path == proj / "models" / "net.tflite"
    assert spec.data.path == proj / "data.npz"
    assert spec.build.out_dir == tmp_path / "out"
    assert spec.build.cache_dir == proj / ".cache"


def test_weight_ratios_accept_fractions():
    spec = Spec.model_validate({"name": "x", "model": {"path": __file__},
                                "train": {"update": {"scheme": "manual",
                                                     "layers": {"fc": {"bias": True, "weight_ratio": "1/8"}}}}})
    assert spec.train.update.layers["fc"].weight_ratio == 0.125


def test_file_fields_enter_the_key_by_content_not_by_path(tmp_path):
    def project(folder: Path, content: bytes):
        folder.mkdir()
        (folder / "net.tflite").write_bytes(content)
        (folder / "imgs" / "0").mkdir(parents=True)
        (folder / "imgs" / "0" / "a.png").write_bytes(b"png")
        (folder / "s.yaml").write_text("model: {path: net.tflite}\ndata: {source: images, path: imgs}\n")
        return load_spec(folder / "s.yaml")

    one, two, other = project(tmp_path / "one", b"m"), project(tmp_path / "two", b"m"), project(tmp_path / "three", b"M")
    pre = slice_preimage(one.model, "model")
    assert pre == {"path": {"sha256": "62c66a7a5dd70c3146618063c344e531e6d4b59e379808443ce962b3abd63c5a"},
                   "format": "auto", "outputs": None, "sequence_length": None}
    assert set(slice_preimage(one.data, "data")["path"]) == {"tree"}
    load = STAGES[0]
    assert stage_preimage(load, one, {}, "") == stage_preimage(load, two, {}, "")
    assert stage_preimage(load, one, {}, "") != stage_preimage(load, other, {}, "")
    assert json.dumps(stage_preimage(load, one, {}, "")).find(str(tmp_path)) == -1


def test_vanished_file_field_is_a_user_error(tmp_path):
    spec = load_spec(_spec(tmp_path, "model: {path: net.tflite}\n"))
    (tmp_path / "net.tflite").unlink()
    with pytest.raises(UserError, match="model.path: .* does not exist"):
        slice_preimage(spec.model, "model")


def test_json_schema_is_a_valid_closed_schema():
    schema = json.loads(json.dumps(json_schema()))
    assert schema["$schema"].startswith("https://json-schema.org/")
    assert schema["type"] == "object" and "model" in schema["required"]
    defs = schema["$defs"]
    json_types = {"object", "array", "string", "number", "integer", "boolean", "null"}

    def walk(node):
        if isinstance(node, dict):
            if "$ref" in node:
                assert node["$ref"].startswith("#/$defs/") and node["$ref"][len("#/$defs/"):] in defs
            if "type" in node:
                types = node["type"] if isinstance(node["type"], list) else [node["type"]]
                assert set(types) <= json_types, node
            if node.get("type") == "object" and "properties" in node and "title" in node:  # a section's model
                assert node.get("additionalProperties") is False, node.get("title")
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(schema)
    kinds = defs["OptimizerSpec"]["properties"]["kind"]["enum"]
    assert kinds == ["sgd", "momentum", "adam", "rmsprop"]


def test_the_shipped_example_is_valid(tmp_path):
    example = REPO / "tinytrain.yaml.example"
    copy = tmp_path / example.name
    shutil.copy(example, copy)
    (tmp_path / "tests" / "fixtures").mkdir(parents=True)
    shutil.copy(REPO / "tests" / "fixtures" / "digits_cnn_float.tflite", tmp_path / "tests" / "fixtures")
    spec = load_spec(copy)
    assert spec.name == "digits" and spec.target.board == "stm32f746-disco"
    assert spec.train.update.scheme == "auto" and spec.train.epochs == 3
    assert spec.data.classes == list(range(10))


def test_every_stage_config_slice_exists_in_the_spec(tmp_path):
    from tinytrain.pipeline.preimage import config_slice

    spec = load_spec(_spec(tmp_path, "model: {path: net.tflite}\ndata: {source: digits}\n"))
    for st in STAGES:
        assert set(config_slice(spec, st.config)) == set(st.config), st.name


def test_tool_identities_enter_the_preimage(tmp_path):
    import sys

    from tinytrain.pipeline.stage_graph import StageDef

    spec = load_spec(_spec(tmp_path, "model: {path: net.tflite}\n"))
    st = StageDef("x", ("target",), (), None, tools=((sys.executable, "--version"),))
    pre = stage_preimage(st, spec, {"up/a.bin": "0" * 64}, "salt!")
    assert pre["tools"] == {f"{sys.executable} --version": f"Python {sys.version.split()[0]}"}
    assert pre["inputs"] == {"up/a.bin": "0" * 64} and pre["salt"] == "salt!" and pre["impl"] == {}


def _regression_npz(tmp_path: Path) -> Path:
    import numpy as np
    p = tmp_path / "reg.npz"
    z = np.zeros((2, 4), np.float32)
    np.savez(p, x_train=z, y_train=z[:, :1], x_test=z, y_test=z[:, :1])
    return p


def test_regression_data_defaults_the_loss_to_mse(tmp_path):
    npz = _regression_npz(tmp_path)
    s = load_spec(_spec(tmp_path, f"model: {{path: net.tflite}}\n"
                                  f"data: {{source: npz, path: {npz}, task: regression}}\n"))
    assert s.train.loss == "mse"


@pytest.mark.parametrize("data,loss,says", [
    ("{source: npz, path: NPZ, task: regression}", "cross_entropy", "regression trains with train.loss: mse"),
    ("{source: digits}", "mse", "train.loss is mse but data.task is classification"),
])
def test_loss_that_contradicts_the_task_is_refused(tmp_path, data, loss, says):
    npz = _regression_npz(tmp_path)
    p = _spec(tmp_path, f"model: {{path: net.tflite}}\ndata: {data.replace('NPZ', str(npz))}\n"
                        f"train: {{loss: {loss}}}\n")
    assert says in _error(p)


# ---- hostile and out-of-range input: one line each, refused before anything is built ----------------

def _one_line_error(path: Path) -> str:
    msg = _error(path)
    assert "\n" not in msg and "Traceback" not in msg, msg
    return msg


def _alias_bomb(levels: int) -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "model: {path: net.tflite}\n" + "\n".join(lines) + "\n"


def test_an_alias_bomb_is_refused_without_expanding_it(tmp_path):
    import tracemalloc

    text = _alias_bomb(9)  # 9**9 = 387 million values once expanded, 1 KB of text
    assert len(text) < 1200
    tracemalloc.start()
    msg = _one_line_error(_spec(tmp_path, text))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert "more than 20000 values once its aliases are expanded" in msg and msg.startswith(f"{tmp_path}")
    assert peak < 50 << 20, f"{peak} bytes allocated"


def test_a_few_aliases_and_merge_keys_still_work(tmp_path):
    text = ("model: {path: net.tflite}\nquantize: &q {num_samples: 7}\n"
            "train:\n  optimizer: &o {kind: adam, beta1: 0.8}\n  qas: {<<: {enabled: false}, rounding: stochastic}\n")
    spec = load_spec(_spec(tmp_path, text))
    assert spec.quantize.num_samples == 7 and spec.train.optimizer.beta1 == 0.8
    assert spec.train.qas.enabled is False and spec.train.qas.rounding == "stochastic"


@pytest.mark.parametrize("text, says", [
    # libyaml stops flow nesting at 1000 levels itself (the pure-Python parser does not): either message.
    ("model: {path: net.tflite}\nx: " + "[" * 5000 + "]" * 5000 + "\n", "nest"),
    ("model: {path: net.tflite}\nx:\n" + "".join(" " * i + "- \n" for i in range(1, 200)), "nests deeper than 64"),
    ("model: {path: net.tflite}\nx: " + "{a: " * 70 + "1" + "}" * 70 + "\n", "nests deeper than 64"),
    ("model: {path: net.tflite}\x00\n", "character U+0000 is not allowed"),
    ("model: {path: net.tflite}\nbuild: {salt: 2024-13-45}\n", "cannot read '2024-13-45' as timestamp"),
    ("model: {path: net.tflite}\nbuild: {salt: !!int many}\n", "cannot read 'many' as int"),
    ("model: {path: net.tflite}\nbuild: {salt: !!python/object:os.system x}\n", "malformed YAML"),
    ("model: {path: net.tflite}\ntrain:\n  <<: 5\n", "expected a mapping or list of mappings for merging"),
    ("model: {path: net.tflite}\n? [a, b]\n: 1\n", "a key must be a plain value"),
    ("model: {path: net.tflite}\nx: *nowhere\n", "found undefined alias"),
    ("model: {path: net.tflite}\n---\nmodel: {path: net.tflite}\n", "expected a single document"),
])
def test_broken_yaml_is_one_line(tmp_path, text, says):
    assert says in _one_line_error(_spec(tmp_path, text))


def test_a_huge_file_is_refused_without_reading_it(tmp_path):
    big = tmp_path / "big.yaml"
    with big.open("wb") as f:
        f.truncate(3 << 30)  # 3 GB, sparse: only what is read costs anything
    assert "larger than 1 MB; refused" in _one_line_error(big)


@pytest.mark.parametrize("raw, says", [(b"model: {path: n\xe9t.tflite}\n", "not UTF-8 text (byte 0xe9"),
                                       (b"\xff\xfe\x00\x00", "not UTF-8")])
def test_a_binary_file_is_one_line(tmp_path, raw, says):
    (tmp_path / "s.yaml").write_bytes(raw)
    assert says in _one_line_error(tmp_path / "s.yaml")


@pytest.mark.parametrize("train, says", [
    ("learning_rate: .inf", "train.learning_rate: should be a finite number, got inf"),
    ("learning_rate: 1e400", "train.learning_rate: should be a finite number, got inf"),
    ("learning_rate: .nan", "train.learning_rate: should be a finite number"),
    ("learning_rate: 1.0e39", "train.learning_rate: 1e+39 does not fit the firmware's 32-bit floats"),
    ("optimizer: {kind: adam, eps: 4e38}", "train.optimizer.eps: 4e+38 does not fit the firmware's 32-bit floats"),
    ("epochs: 99999999999999999999999", "train.epochs: 99999999999999999999999 does not fit the firmware's 32-bit"),
    ("seed: 4294967296", "train.seed: 4294967296 does not fit the firmware's 32-bit unsigned integers"),
    ("max_train_samples: 4294967296", "train.max_train_samples: 4294967296 does not fit"),
    ("epochs: yes", "train.epochs: should be a valid integer, got True"),
    ("epochs: '3'", "train.epochs: should be a valid integer, got '3'"),
    ("epochs: 2.5", "train.epochs: should be a valid integer, got 2.5"),
    ("learning_rate: '0.01'", "train.learning_rate: should be a valid number, got '0.01'"),
    ("learning_rate: true", "train.learning_rate: should be a valid number, got True"),
    ("qas: {enabled: 1}", "train.qas.enabled: should be a valid boolean, got 1"),
    ("qas: {enabled: 'false'}", "train.qas.enabled: should be a valid boolean, got 'false'"),
])
def test_values_that_would_fail_late_are_refused_at_spec_time(tmp_path, train, says):
    msg = _one_line_error(_spec(tmp_path, f"model: {{path: net.tflite}}\ntrain:\n  {train}\n"))
    assert msg.startswith(f"{tmp_path / 'tinytrain.yaml'}:3: ") and says in msg, msg


def test_numbers_are_read_as_yaml_1_2_reads_them(tmp_path):
    spec = load_spec(_spec(tmp_path, "model: {path: net.tflite}\ntrain: {learning_rate: 1e-3, epochs: 2}\n"
                                     "target: {timeout_s: 1.5E+2}\nquantize: {percentile: .9999e2}\n"
                                     "data: {source: digits, classes: [1, 2]}\n"))
    assert spec.train.learning_rate == 0.001 and spec.train.epochs == 2
    assert spec.target.timeout_s == 150.0 and spec.quantize.percentile == 99.99


def test_the_spec_limits_are_the_firmware_limits(tmp_path):
    """The largest values the spec accepts are exactly what runtime.bin can carry: one past them is refused."""
    import math

    from tinytrain.stages.emulate_run import runtime_config
    from tinytrain.stages.train.runtime_config import F32_MAX, U32_MAX, RuntimeConfig

    text = (f"model: {{path: net.tflite}}\ntrain: {{epochs: {U32_MAX}, seed: {U32_MAX}, "
            f"max_train_samples: {U32_MAX}, learning_rate: {F32_MAX!r}}}\n")
    spec = load_spec(_spec(tmp_path, text))
    cfg = {f"train.{k}": getattr(spec.train, k) for k in ("learning_rate", "epochs", "seed", "batch_size",
                                                           "max_train_samples", "optimizer")}
    rc = RuntimeConfig.from_bytes(runtime_config(cfg).to_bytes())
    assert (rc.epochs, rc.seed, rc.max_train_samples, rc.learning_rate) == (U32_MAX, U32_MAX, U32_MAX, F32_MAX)
    with pytest.raises(ValueError):
        RuntimeConfig(epochs=U32_MAX + 1)
    with pytest.raises(OverflowError):
        RuntimeConfig(learning_rate=math.nextafter(F32_MAX, math.inf) * 2).to_bytes()
    assert "does not fit" in _error(_spec(tmp_path, text.replace(str(U32_MAX), str(U32_MAX + 1), 1)))
    above = f"{math.nextafter(F32_MAX, math.inf)!r}"
    assert "does not fit" in _error(_spec(tmp_path, text.replace(f"{F32_MAX!r}", above)))


def test_keys_are_the_text_written(tmp_path):
    text = ("model: {path: net.tflite}\ntrain:\n  update:\n    scheme: manual\n"
            "    layers: {5: {bias: true}, yes: {weight_ratio: 1/8}, '#7': {weight_ratio: 0.25}}\n")
    spec = load_spec(_spec(tmp_path, text))
    assert set(spec.train.update.layers) == {"5", "yes", "#7"}
    assert spec.train.update.layers["yes"].weight_ratio == 0.125
    assert ":1: 1: unknown key '1'" in _error(_spec(tmp_path, "1: x\nmodel: {path: net.tflite}\n"))


def test_the_examples_choice_comments_list_exactly_the_choices():
    """`board: x   # a | b | c` in the shipped example names every choice the spec has, and no other."""
    import re

    # Per field name, the choice sets of every field so named (train.loss and train.outputs[].loss differ).
    choices: dict[str, list[set]] = {}

    def collect(node):
        if isinstance(node, dict):
            for key, prop in node.get("properties", {}).items():
                if "enum" in prop:
                    choices.setdefault(key, []).append(set(prop["enum"]))
            for v in node.values():
                collect(v)

    collect(json_schema())
    checked = 0
    for line in (REPO / "tinytrain.yaml.example").read_text().splitlines():
        m = re.match(r"^\s*(\w+):\s*\S+\s*#\s*(.*\|.*)$", line)
        if m:
            listed = {alt.split()[0] for alt in m.group(2).split("|")}
            assert listed in choices[m.group(1)], line
            checked += 1
    assert checked >= 8
