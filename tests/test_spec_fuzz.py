"""Fuzzing the spec loader with malformed YAML made from the repository's specs: truncations, byte flips,
swapped types, huge numbers, deep nesting, aliases. Every case loads or fails with a SpecError whose every
line names the file and line of one problem (no traceback, no other exception); and where the YAML parses,
the JSON Schema gives the same verdict as the loader.
"""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys

import pytest
import yaml

from spec_corpus import REPO_SPECS, VALID, project
from tinytrain.pipeline.errors import SpecError
from tinytrain.pipeline.spec import json_schema_text, load_spec
from tinytrain.pipeline.yaml_source import load_yaml

SEEDS = [p.read_text() for p in REPO_SPECS] + list(VALID.values())
SWAPS = [True, "yes", "text", 1.5, -1, 0, 10**30, 2**32, float("inf"), [], {}, None, [1, "a"], {"k": 1},
         "1/8", 0.125, "mse", "regression", "manual", "zoo:nope", "#5"]


def _flip(rng: random.Random, text: str) -> bytes:
    raw = bytearray(text.encode())
    for _ in range(rng.randint(1, 4)):
        raw[rng.randrange(len(raw))] = rng.choice([rng.randrange(256), *b"\x00:-[]{}&*!|>'\"#\n\t %"])
    return bytes(raw)


def _leaves(data, path=()):
    if isinstance(data, dict):
        for k, v in data.items():
            yield from _leaves(v, path + (k,))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from _leaves(v, path + (i,))
    if path:
        yield path


def _swap(rng: random.Random, text: str) -> bytes:
    """Replace one value (or rename or drop one key) somewhere in the document."""
    data = yaml.safe_load(text)
    path = rng.choice(list(_leaves(data)))
    parent = data
    for p in path[:-1]:
        parent = parent[p]
    action = rng.random()
    if action < 0.75 or not isinstance(parent, dict):
        parent[path[-1]] = rng.choice(SWAPS)
    elif action < 0.9:
        parent[path[-1] + "x"] = parent.pop(path[-1])
    else:
        del parent[path[-1]]
    return yaml.safe_dump(data, sort_keys=False).encode()


def _mutate(rng: random.Random, text: str) -> bytes:
    kind = rng.randrange(6)
    if kind == 0:  # truncation
        return text.encode()[: rng.randrange(len(text))]
    if kind == 1:
        return _flip(rng, text)
    if kind == 2:
        return _swap(rng, text)
    if kind == 3:  # a huge number in place of one
        numbers = list(re.finditer(r"(?<![\w.])\d+(\.\d+)?(?![\w.])", text))
        if numbers:
            m = rng.choice(numbers)
            return (text[: m.start()] + rng.choice(["9" * 400, "1e400", "-1e400", "4294967296", "3.5e38"])
                    + text[m.end():]).encode()
        return text.encode()
    if kind == 4:  # deep nesting, flow or block
        n = rng.choice([10, 63, 65, 300, 3000])
        deep = ("[" * n + "]" * n) if rng.random() < 0.5 else "".join("\n" + " " * (i + 1) + "- " for i in range(n))
        return (text + f"\nextra: {deep}\n").encode()
    return (text + "\n" + _aliases(rng.randint(2, 9)) + "\n").encode()  # aliases, up to a bomb


def _aliases(levels: int) -> str:
    """`levels` levels of nine aliases each: 9**levels values once expanded."""
    lines = ["b0: &b0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"b{i}: &b{i} [{', '.join([f'*b{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(lines)


def _verdicts_differ_for_a_known_reason(message: str, data) -> bool:
    """Where JSON Schema cannot follow the loader: whether a file exists, NaN (JSON has none), and 2.0 for an
    integer (JSON Schema counts it as one, the loader wants 2)."""
    lines = message.splitlines()
    return all(re.search(r": model\.path: (file not found|not a file|unknown zoo model)", line)
               or re.search(r"should be a (valid integer, got -?\d+\.0|finite number, got nan)$", line)
               for line in lines)


def _cases(count: int) -> list[bytes]:
    rng = random.Random(15)
    return [_mutate(rng, rng.choice(SEEDS)) for _ in range(count)]


def test_fuzzed_specs_load_or_fail_with_one_line_per_problem(tmp_path):
    import jsonschema

    validator = jsonschema.Draft202012Validator(json.loads(json_schema_text()))
    folder = project(tmp_path)
    (folder / "tests" / "fixtures").mkdir(parents=True)
    (folder / "tests" / "fixtures" / "digits_cnn_float.tflite").write_bytes(b"model")
    spec = folder / "s.yaml"
    located = re.compile(rf"^{re.escape(str(spec))}(:\d+(:\d+)?)?: \S")
    outcomes = {"loaded": 0, "refused": 0, "compared": 0}
    for i, raw in enumerate(_cases(400)):
        spec.write_bytes(raw)
        try:
            load_spec(spec)
            loaded, message = True, ""
        except SpecError as e:
            loaded, message = False, str(e)
            lines = message.splitlines()
            assert lines and all(located.match(line) for line in lines), (i, raw[:300], message)
        outcomes["loaded" if loaded else "refused"] += 1
        # The schema's verdict, where the YAML itself is readable.
        try:
            data = load_yaml(raw.decode("utf-8"), str(spec)).data
        except (SpecError, UnicodeDecodeError):
            continue
        outcomes["compared"] += 1
        schema_ok = validator.is_valid(data)
        if loaded != schema_ok:
            assert not loaded and _verdicts_differ_for_a_known_reason(message, data), \
                (i, raw[:400], message or "loaded", [e.message for e in validator.iter_errors(data)][:3])
    # The mutations must reach both outcomes and the schema comparison often, or the test proves little.
    assert outcomes["loaded"] >= 40 and outcomes["refused"] >= 200 and outcomes["compared"] >= 200, outcomes


@pytest.mark.parametrize("what, raw", [
    ("alias bomb", f"model: {{path: net.tflite}}\n{_aliases(9)}\n".encode()),
    ("NUL byte", b"model: {path: net.tflite}\x00\n"),
    ("deep nesting", ("model: {path: net.tflite}\nx: " + "{a: " * 5000 + "}" * 5000 + "\n").encode()),
    ("huge epochs", b"model: {path: net.tflite}\ntrain: {epochs: 99999999999999999999999}\n"),
    ("truncated", VALID["manual"].encode()[:333]),
])
def test_the_cli_refuses_bad_specs_with_one_line_and_exit_2(tmp_path, what, raw):
    spec = project(tmp_path) / "s.yaml"
    spec.write_bytes(raw)
    proc = subprocess.run([sys.executable, "-m", "tinytrain", "build", str(spec), "--cache-dir", str(tmp_path / "c")],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 2, (what, proc.stderr)
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and proc.stderr.startswith(f"error: {spec}:"), proc.stderr
    assert not (tmp_path / "c").exists() or not list((tmp_path / "c").rglob("*.json"))

