"""`tinytrain schema` accepts what the loader accepts, judged by a real JSON-Schema validator: every spec in
the repository and a set of valid ones validate, and every invalid one fails both."""

from __future__ import annotations

import json
import re

import pytest

from spec_corpus import INVALID, REPO_SPECS, VALID, project
from tinytrain.pipeline.errors import SpecError
from tinytrain.pipeline.spec import SCHEMA_ID, json_schema, json_schema_text, load_spec
from tinytrain.pipeline.yaml_source import load_yaml

jsonschema = pytest.importorskip("jsonschema")


@pytest.fixture(scope="module")
def validator():
    schema = json.loads(json_schema_text())  # what `tinytrain schema` prints
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def schema_errors(validator, text: str) -> list[str]:
    """The validator's verdict on a spec as the loader reads its YAML."""
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
            for e in validator.iter_errors(load_yaml(text, "spec.yaml").data)]


def schema_error_paths(validator, text: str) -> list[tuple]:
    """Where the validator finds fault; a missing or unknown key counts at the key's own path."""
    out = []
    for e in validator.iter_errors(load_yaml(text, "spec.yaml").data):
        for leaf in (e.context or [e]):  # anyOf / if-then: the alternatives' own errors
            path = tuple(str(p) for p in leaf.absolute_path)
            if leaf.validator == "required" and isinstance(leaf.instance, dict):
                out += [path + (k,) for k in leaf.validator_value if k not in leaf.instance]
            elif leaf.validator == "additionalProperties" and isinstance(leaf.instance, dict):
                out += [path + (str(k),) for k in leaf.instance if k not in leaf.schema.get("properties", {})]
            else:
                out.append(path)
    return out


def loader_error_paths(message: str) -> list[tuple]:
    """The yaml paths in a SpecError's `file:line: path: message` lines (() for the top level)."""
    out = []
    for line in message.splitlines():
        m = re.search(r":\d+: ([^ ]+): ", line)
        path = m.group(1) if m and m.group(1) != "(top level)" else ""
        out.append(tuple(p for p in re.split(r"[.\[\]]+", path) if p))
    return out


def same_fault(schema_paths: list[tuple], loader_paths: list[tuple]) -> bool:
    """Both point at the same place: one path holds the other (the loader reports a cross-field rule at the
    section, the schema at the key), and only a top-level loader error matches a top-level schema one."""
    return any(lp == () or (sp and (sp[:len(lp)] == lp or lp[:len(sp)] == sp))
               for sp in schema_paths for lp in loader_paths)


def test_the_schema_has_an_id_and_a_dialect():
    schema = json_schema()
    assert schema["$id"] == SCHEMA_ID and schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert "name" not in schema["required"], "the loader names a build after its file"


@pytest.mark.parametrize("path", REPO_SPECS, ids=lambda p: p.name)
def test_every_spec_in_the_repository_validates(validator, path):
    assert schema_errors(validator, path.read_text()) == []
    load_spec(path)


@pytest.mark.parametrize("name", VALID)
def test_valid_specs_pass_both(validator, tmp_path, name):
    (project(tmp_path) / "s.yaml").write_text(VALID[name])
    load_spec(tmp_path / "s.yaml")
    assert schema_errors(validator, VALID[name]) == []


@pytest.mark.parametrize("name", INVALID)
def test_invalid_specs_fail_both(validator, tmp_path, name):
    text, says = INVALID[name]
    (project(tmp_path) / "s.yaml").write_text(text)
    with pytest.raises(SpecError) as e:
        load_spec(tmp_path / "s.yaml")
    assert says in str(e.value)
    assert schema_errors(validator, text), f"the schema accepts what the loader refuses: {e.value}"
    assert same_fault(schema_error_paths(validator, text), loader_error_paths(str(e.value))), \
        (str(e.value), schema_errors(validator, text))


def test_the_ranges_come_from_the_firmware(validator):
    from tinytrain.stages.train.runtime_config import F32_MAX, U32_MAX

    epochs = json_schema()["$defs"]["TrainSpec"]["properties"]["epochs"]
    assert (epochs["minimum"], epochs["maximum"]) == (1, U32_MAX)
    lr = json_schema()["$defs"]["TrainSpec"]["properties"]["learning_rate"]
    assert (lr["exclusiveMinimum"], lr["maximum"]) == (0, F32_MAX)
    assert schema_errors(validator, f"model: {{path: x}}\ntrain: {{epochs: {U32_MAX}}}\n") == []
    assert schema_errors(validator, f"model: {{path: x}}\ntrain: {{epochs: {U32_MAX + 1}}}\n")


def test_the_readme_says_how_to_use_the_schema_and_states_the_limits():
    from spec_corpus import REPO
    from tinytrain.pipeline.yaml_source import MAX_BYTES, MAX_DEPTH, MAX_NODES

    text = (REPO / "README.md").read_text()
    assert "# yaml-language-server: $schema=./tinytrain.schema.json" in text
    assert "tinytrain schema > tinytrain.schema.json" in text and SCHEMA_ID in text
    assert f"over {MAX_BYTES >> 20} MB, nested deeper than {MAX_DEPTH} levels" in text
    assert f"more than {MAX_NODES} values" in text
