"""A GPU host's model version (`gpu_host.version`, `shared.model_version`): what it is made of,
what changes it and what does not."""

from __future__ import annotations

import re
from importlib.metadata import version
from pathlib import Path

from analysis.hairline.decision import DECISION_FILE
from gpu_host.comfyui import load_workflow
from gpu_host.version import BISENET_INPUT, WORKFLOW_INPUT, host_model_version
from shared.contract import model_version_or_none
from shared.model_version import MISSING, analysis_inputs, analysis_version, compose

FORMAT = re.compile(r"(?P<package>[^+]+)\+[0-9a-f]{12}")


def test_the_version_is_the_package_version_and_twelve_hex_digits_a_gateway_passes_on() -> None:
    value = host_model_version("", None).value
    match = FORMAT.fullmatch(value)
    assert match is not None and match["package"] == version("hairgate")
    assert model_version_or_none(value) == value


def test_it_hashes_the_network_weights_and_the_fitted_parameters_not_the_licence() -> None:
    names = set(analysis_inputs())
    assert {"analysis/data/hair_segmentation.tflite", f"analysis/data/{DECISION_FILE}"} <= names
    assert "analysis/data/NOTICE" not in names
    # without BiSeNet or ComfyUI a host answers with the analysis alone: the gateway's version
    assert host_model_version("", None) == analysis_version()


def test_a_changed_parameter_file_is_another_version() -> None:
    inputs = analysis_inputs()
    refitted = {**inputs, f"analysis/data/{DECISION_FILE}": "0" * 64}  # `make fit` wrote new parameters
    assert compose(refitted).value != compose(inputs).value


def test_bisenet_weights_count_by_content_not_by_path(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    first, same_elsewhere, other = tmp_path / "w.pth", tmp_path / "a" / "copy.pth", tmp_path / "other.pth"
    first.write_bytes(b"weights v1")
    same_elsewhere.write_bytes(b"weights v1")
    other.write_bytes(b"weights v2")
    versions = [host_model_version(str(path), None) for path in (first, same_elsewhere, other)]
    assert versions[0].value == versions[1].value != versions[2].value
    assert versions[0].value != host_model_version("", None).value
    missing = host_model_version(str(tmp_path / "nope.pth"), None)  # the child says why it cannot load
    assert dict(missing.inputs)[BISENET_INPUT] == MISSING


def test_the_comfyui_workflow_counts_when_it_draws_reformatting_does_not() -> None:
    workflow = load_workflow("")
    reordered = dict(reversed(list(workflow.items())))  # the same graph, written in another order
    changed = {**workflow, "999": {"class_type": "SaveImage", "inputs": {}}}
    drawing = host_model_version("", workflow)
    assert drawing.value == host_model_version("", reordered).value
    assert drawing.value != host_model_version("", changed).value
    assert drawing.value != host_model_version("", None).value  # the built-in preview draws instead
    assert WORKFLOW_INPUT in dict(drawing.inputs)


def test_the_start_line_names_each_input_by_its_digest() -> None:
    described = host_model_version("", load_workflow("")).describe()
    assert re.fullmatch(r"(\S+=[0-9a-f]{12} ?)+", described), described
    assert f"analysis/data/{DECISION_FILE}=" in described and f"{WORKFLOW_INPUT}=" in described
