"""Endpoint 4 on the gateway against a fake OpenAI-compatible LLM on loopback (real HTTP).

The photo checks are the face workers' jobs; here they run in-process in a thread
(`JobsInThread`) so that each test does not pay a worker start, except the `slow` test that
goes through real worker processes. The face-worker pool itself is tested in
test_special_points.py.
"""

from __future__ import annotations

import base64
import io
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import numpy as np
import pytest
import trio
from PIL import Image
from skimage import data

from edge.local.face_jobs import Refusal
from edge.local.face_workers import FaceWorkers
from edge.local.features import (
    NOT_CONFIGURED_RETRY_AFTER_SECONDS,
    RETRY_AFTER_SECONDS,
    SCHEMA_NAME,
    FaceFeatures,
    Features,
    strict_schema,
)
from shared.contract import MSG_FEATURES_NOT_CONFIGURED, MSG_FEATURES_UNAVAILABLE, Code, ContractError
from shared.settings import AnalysisSettings, FeaturesSettings
from tests.analysis.images import encode, no_face_photo
from tests.fakes.fake_llm import VALID_FEATURES, FakeLLM, Mode, serve_fake_llm

API_KEY = "sk-test-4f1b9c2e-never-in-a-log"
MODEL = "doubao-seed-1-6-vision-test"
LIMITS = AnalysisSettings()


class JobsInThread:
    """The face workers' `call`, run in a thread of this process: same jobs, no spawn."""

    def __init__(self) -> None:
        self.calls = 0

    async def call(self, request_id: str, job: Callable[..., Any], *args: Any) -> Any:
        self.calls += 1
        result = await trio.to_thread.run_sync(job, *args)
        if isinstance(result, Refusal):
            raise result.error()
        return result


def multipart(image: bytes) -> tuple[bytes, str]:
    request = httpx.Request("POST", "http://gateway.test/", files={"image": ("photo.jpg", image)})
    return request.read(), request.headers["content-type"]


def astronaut_upload(side: int = 2048) -> tuple[bytes, str]:
    photo = Image.fromarray(data.astronaut()).resize((side, side), Image.Resampling.LANCZOS)
    return multipart(encode(photo, "JPEG", quality=90))


@pytest.fixture
async def llm(nursery: trio.Nursery) -> FakeLLM:
    fake = FakeLLM()
    fake.knobs.api_key = API_KEY
    await nursery.start(serve_fake_llm, fake)
    return fake


def settings_for(llm: FakeLLM, **overrides: Any) -> FeaturesSettings:
    values = {"base_url": llm.base_url, "model": MODEL, "api_key": API_KEY, "timeout_seconds": 10, **overrides}
    return FeaturesSettings(**values)


@pytest.fixture
def jobs() -> JobsInThread:
    return JobsInThread()


@pytest.fixture
async def features(nursery: trio.Nursery, llm: FakeLLM, jobs: JobsInThread) -> AsyncIterator[Features]:
    served = Features(settings_for(llm), jobs, LIMITS)  # type: ignore[arg-type]
    await nursery.start(served.run)
    yield served


async def test_a_valid_answer_is_returned_with_the_model(features: Features, llm: FakeLLM) -> None:
    answer = await features.answer(*astronaut_upload(), request_id="r-ok")
    assert (answer.envelope["code"], answer.envelope["request_id"], answer.retry_after) == (0, "r-ok", None)
    assert answer.envelope["data"] == {**VALID_FEATURES, "model": MODEL}

    [sent] = llm.requests
    assert sent.headers["authorization"] == f"Bearer {API_KEY}"
    assert sent.body["model"] == MODEL
    assert sent.body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": SCHEMA_NAME, "strict": True, "schema": strict_schema(FaceFeatures)},
    }
    [image_part] = [
        part
        for message in sent.body["messages"]
        if isinstance(message["content"], list)
        for part in message["content"]
        if part["type"] == "image_url"
    ]
    prefix, encoded = image_part["image_url"]["url"].split(",", 1)
    assert prefix == "data:image/jpeg;base64"
    with Image.open(io.BytesIO(base64.b64decode(encoded))) as sent_photo:
        assert (sent_photo.format, sent_photo.size) == ("JPEG", (1024, 1024))  # 2048 px upload, shrunk


def test_the_schema_is_strict_mode_compatible() -> None:
    schema = strict_schema(FaceFeatures)
    assert "$ref" not in json.dumps(schema) and "$defs" not in schema

    def objects(node: Any) -> list[dict[str, Any]]:
        if isinstance(node, dict):
            found = [node] if node.get("type") == "object" else []
            return found + [inner for value in node.values() for inner in objects(value)]
        return []

    every = objects(schema)
    assert len(every) == 2  # the answer and its `skin`
    for node in every:
        assert node["additionalProperties"] is False
        assert sorted(node["required"]) == sorted(node["properties"])
    assert schema["properties"]["face_shape"]["enum"] == [
        "oval",
        "round",
        "square",
        "heart",
        "oblong",
        "diamond",
        "triangle",
    ]


@pytest.mark.parametrize(
    ("script", "requests", "code"),
    [
        ([Mode.INVALID_JSON, Mode.INVALID_JSON], 2, Code.SYSTEM_ERROR),
        ([Mode.SCHEMA_VIOLATION, Mode.SCHEMA_VIOLATION], 2, Code.SYSTEM_ERROR),
        ([Mode.SCHEMA_VIOLATION, Mode.VALID], 2, Code.OK),  # asked once more, then fine
        ([Mode.INVALID_JSON, Mode.VALID], 2, Code.OK),
        ([Mode.HTTP_500], 1, Code.SYSTEM_ERROR),  # an upstream error is not retried
    ],
    ids=[
        "invalid-json-twice",
        "schema-violation-twice",
        "schema-violation-then-valid",
        "invalid-json-then-valid",
        "http-500",
    ],
)
async def test_invalid_answers_are_retried_once_and_errors_are_1007(
    features: Features, llm: FakeLLM, script: list[Mode], requests: int, code: Code
) -> None:
    llm.knobs.script = list(script)
    answer = await features.answer(*astronaut_upload(512), request_id="r")
    assert len(llm.requests) == requests
    assert answer.envelope["code"] == code
    if code is Code.SYSTEM_ERROR:
        assert answer.envelope["message"] == MSG_FEATURES_UNAVAILABLE
        assert answer.retry_after == RETRY_AFTER_SECONDS


async def test_an_llm_that_never_answers_times_out_as_1007(
    nursery: trio.Nursery, llm: FakeLLM, jobs: JobsInThread
) -> None:
    llm.knobs.mode = Mode.NEVER_ANSWER
    features = Features(settings_for(llm, timeout_seconds=0.5), jobs, LIMITS)  # type: ignore[arg-type]
    await nursery.start(features.run)
    with trio.fail_after(5):  # the endpoint's own deadline must end it, not this one
        answer = await features.answer(*astronaut_upload(512), request_id="r-slow")
    assert (answer.envelope["code"], answer.envelope["message"]) == (Code.SYSTEM_ERROR, MSG_FEATURES_UNAVAILABLE)
    assert answer.retry_after == RETRY_AFTER_SECONDS
    assert len(llm.requests) == 1


async def test_an_llm_that_is_down_is_1007(nursery: trio.Nursery, jobs: JobsInThread) -> None:
    with trio.socket.socket() as unused:  # a port nobody listens on
        await unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    settings = FeaturesSettings(base_url=f"http://127.0.0.1:{port}/api/v3", model=MODEL, api_key=API_KEY)
    features = Features(settings, jobs, LIMITS)  # type: ignore[arg-type]
    await nursery.start(features.run)
    answer = await features.answer(*astronaut_upload(512), request_id="r-down")
    assert (answer.envelope["code"], answer.envelope["message"]) == (Code.SYSTEM_ERROR, MSG_FEATURES_UNAVAILABLE)


async def test_not_configured_is_1007_without_looking_at_the_photo(nursery: trio.Nursery, jobs: JobsInThread) -> None:
    features = Features(FeaturesSettings(), jobs, LIMITS)  # type: ignore[arg-type]
    await nursery.start(features.run)
    answer = await features.answer(*astronaut_upload(512), request_id="r-off")
    assert (answer.envelope["code"], answer.envelope["message"]) == (Code.SYSTEM_ERROR, MSG_FEATURES_NOT_CONFIGURED)
    assert answer.retry_after == NOT_CONFIGURED_RETRY_AFTER_SECONDS
    assert jobs.calls == 0


async def test_a_refused_photo_never_reaches_the_llm(features: Features, llm: FakeLLM) -> None:
    no_face = np.asarray(Image.fromarray(no_face_photo()).resize((800, 1200)))
    answer = await features.answer(*multipart(encode(no_face, "JPEG")), request_id="r-1005")
    assert (answer.envelope["code"], answer.retry_after) == (Code.NO_FACE, None)
    answer = await features.answer(b'{"image_base64": ""}', "application/json", request_id="r-1001")
    assert answer.envelope["code"] == Code.INVALID_PARAMETER
    assert llm.requests == []


async def test_the_api_key_never_reaches_a_log_or_an_answer(
    features: Features, llm: FakeLLM, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # httpx and httpcore included
    llm.knobs.script = [Mode.HTTP_500, Mode.INVALID_JSON, Mode.INVALID_JSON, Mode.VALID]
    answers = [await features.answer(*astronaut_upload(512), request_id=f"r-{n}") for n in range(3)]
    features.settings = settings_for(llm, api_key="sk-wrong-key-also-secret")  # the LLM answers 401
    answers.append(await features.answer(*astronaut_upload(512), request_id="r-401"))
    assert [answer.envelope["code"] for answer in answers] == [1007, 1007, 0, 1007]
    assert "面部特征分析失败" in caplog.text  # the failures were logged...
    for secret in (API_KEY, "sk-wrong-key-also-secret"):  # ...without the key
        assert secret not in caplog.text
        assert all(secret not in json.dumps(answer.envelope, ensure_ascii=False) for answer in answers)
    assert all(API_KEY not in json.dumps(sent.body) for sent in llm.requests)  # only in the header


@pytest.mark.slow
async def test_through_real_face_workers(nursery: trio.Nursery, llm: FakeLLM) -> None:
    workers = FaceWorkers(1, queue_wait_seconds=60)
    await nursery.start(workers.run)
    features = Features(settings_for(llm), workers, LIMITS)
    await nursery.start(features.run)
    answer = await features.answer(*astronaut_upload(), request_id="r-real")
    assert answer.envelope["data"] == {**VALID_FEATURES, "model": MODEL}
    no_face = np.asarray(Image.fromarray(no_face_photo()).resize((800, 1200)))
    answer = await features.answer(*multipart(encode(no_face, "JPEG")), request_id="r-1005")
    assert answer.envelope["code"] == Code.NO_FACE
    assert len(llm.requests) == 1


def test_a_refusal_survives_the_process_boundary() -> None:
    error = Refusal(int(Code.NOT_FRONTAL), "人脸角度过大").error()
    assert isinstance(error, ContractError) and (error.code, error.message) == (Code.NOT_FRONTAL, "人脸角度过大")
