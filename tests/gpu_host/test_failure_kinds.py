"""The host names its failure (gateway.md § Failure kinds): the child classifies what the
analysis raised, the host puts the kind in the 1007's `data` and in `X-Error-Type`.

The CUDA kinds are raised by a real spawned child (the fake one, running the real answer
loop) through `gpu_host.failure_kinds.simulated_exception`: torch's own exception classes,
nothing patched; the switch file the real child reads is tested on its own."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import trio
from PIL import Image, UnidentifiedImageError

from gpu_host.failure_kinds import classify, fail_load_if_simulated, raise_simulated
from shared.contract import (
    HEADER_ERROR_TYPE,
    MSG_BACKEND_UNAVAILABLE,
    MSG_CUDA_ERROR,
    MSG_CUDA_OOM,
    MSG_MODEL_LOAD_FAILED,
    ErrorType,
)
from tests.gpu_host.conftest import WAIT_SECONDS, fake_model, post_image, serving


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), ErrorType.CUDA_OOM),
        (RuntimeError("CUDA out of memory. Tried to allocate 512.00 MiB"), ErrorType.CUDA_OOM),  # torch < 1.13
        (torch.AcceleratorError("CUDA error: an illegal memory access was encountered"), ErrorType.CUDA_ERROR),
        (RuntimeError("CUDA error: device-side assert triggered"), ErrorType.CUDA_ERROR),
        (RuntimeError("cuDNN error: CUDNN_STATUS_INTERNAL_ERROR"), ErrorType.CUDA_ERROR),
        (RuntimeError("CUBLAS_STATUS_EXECUTION_FAILED when calling cublasSgemm"), ErrorType.CUDA_ERROR),
        (UnidentifiedImageError("cannot identify image file"), ErrorType.INPUT_REJECTED),
        (Image.DecompressionBombError("Image size exceeds limit"), ErrorType.INPUT_REJECTED),
        (MemoryError(), ErrorType.INTERNAL),  # the host's RAM, not the GPU's: nothing to back off for
        (ValueError("operands could not be broadcast together"), ErrorType.INTERNAL),
    ],
)
def test_an_exception_is_classified_by_what_torch_and_pil_raise(error: BaseException, kind: ErrorType) -> None:
    assert classify(error) is kind


def test_the_switch_file_is_read_one_line_per_inference(tmp_path: Path) -> None:
    switch = tmp_path / "failures"
    switch.write_text("cuda_oom\n\ncuda_error\nsleep:0.01\n")
    raised = []
    for _ in range(4):
        try:
            raise_simulated(str(switch))
            raised.append(None)
        except Exception as error:  # the kind is what the test reads
            raised.append(classify(error))
    assert raised == [ErrorType.CUDA_OOM, ErrorType.CUDA_ERROR, None, None]
    assert switch.read_text() == ""
    raise_simulated(str(tmp_path / "absent"))  # no file: nothing happens
    raise_simulated("")  # the switch off


def test_a_load_takes_only_its_own_line(tmp_path: Path) -> None:
    switch = tmp_path / "failures"
    switch.write_text("cuda_oom\nload_fail\n")
    fail_load_if_simulated(str(switch))  # the first line is an inference's: the load goes on
    fail_load_if_simulated("")
    assert switch.read_text() == "cuda_oom\nload_fail\n"


@pytest.mark.parametrize(
    ("command", "code", "data", "kind", "message"),
    [
        (b"kind:cuda_oom", 1007, {"error_type": "cuda_oom"}, "cuda_oom", MSG_CUDA_OOM),
        (b"kind:cuda_error", 1007, {"error_type": "cuda_error"}, "cuda_error", MSG_CUDA_ERROR),
        (b"raise", 1007, {"error_type": "internal"}, "internal", None),
        (b"kind:input_rejected", 1002, None, "input_rejected", None),  # the photo's own code
        (b"fail:1005", 1005, None, "input_rejected", "scripted failure"),
        (b"ok", 0, ..., None, "成功"),
    ],
)
async def test_the_host_names_the_childs_failure_in_data_and_header(
    command: bytes, code: int, data: object, kind: str | None, message: str | None
) -> None:
    model = fake_model()
    async with serving(model) as client:
        await model.wait_ready()
        answer = await post_image(client, command)
        following = await post_image(client, b"ok")  # none of these costs the child
    body = await answer.get_json()
    assert (answer.status_code, body["code"], answer.headers.get(HEADER_ERROR_TYPE)) == (200, code, kind)
    if data is not ...:
        assert body["data"] == data
    if message is not None:
        assert body["message"] == message
    assert (await following.get_json())["code"] == 0
    assert model.statistics().restarts == 0


async def test_a_timed_out_inference_is_named_timeout() -> None:
    model = fake_model(timeout=1.0)
    async with serving(model) as client:
        await model.wait_ready()
        hung = await post_image(client, b"hang")
    body = await hung.get_json()
    assert (body["code"], body["data"], hung.headers[HEADER_ERROR_TYPE]) == (1007, {"error_type": "timeout"}, "timeout")


async def test_a_host_whose_models_cannot_load_says_model_load_failed() -> None:
    model = fake_model(load="fail")
    async with serving(model) as client:
        with trio.fail_after(WAIT_SECONDS):
            while model.statistics().message is None:
                await model.wait_transition()
        answer = await post_image(client, b"ok")
    body = await answer.get_json()
    assert (answer.status_code, body["code"], body["message"]) == (503, 1007, MSG_MODEL_LOAD_FAILED)
    assert body["data"] == {"error_type": "model_load_failed"}
    assert answer.headers[HEADER_ERROR_TYPE] == "model_load_failed"


async def test_a_host_loading_for_the_first_time_says_model_not_loaded(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    os.mkfifo(gate)  # the child waits here before Ready: loading
    model = fake_model(load_gate=str(gate))
    async with serving(model) as client:
        answer = await post_image(client, b"ok")

        def release() -> None:
            with open(gate, "w") as pipe:
                pipe.write("go\n")

        await trio.to_thread.run_sync(release)
    body = await answer.get_json()
    assert (answer.status_code, body["message"]) == (503, MSG_BACKEND_UNAVAILABLE)
    assert (body["data"], answer.headers[HEADER_ERROR_TYPE]) == ({"error_type": "model_not_loaded"}, "model_not_loaded")
