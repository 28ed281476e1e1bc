"""The one response shape of every `/api/` endpoint: `{code, message, request_id, data}`.

The dicts the services send are built here (`envelope` and its callers), and the same shape
as pydantic models (`answer_model`: an endpoint's success or a `Refusal`), which the document
shows and the end-to-end tests check every real answer with (`envelope_errors`); a test
checks that the two agree (tests/shared/test_contract.py).
"""

from __future__ import annotations

import functools
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel, ValidationError

from shared.contract.codes import DEFAULT_MESSAGES, Code, ContractError, ErrorType
from shared.contract.endpoints import endpoint
from shared.contract.hop import BUSY_KEY
from shared.contract.messages import MSG_HOST_BUSY

ENVELOPE_KEYS = frozenset({"code", "message", "request_id", "data"})
ERROR_TYPE_KEY = "error_type"  # a host's 1007 `data`: {"error_type": "<ErrorType>"}


def envelope(code: Code, request_id: str, data: Any = None, message: str | None = None) -> dict:
    """The one response shape of every /api/ endpoint; `data` is null unless code is 0."""
    code = Code(code)
    return {
        "code": int(code),
        "message": message or DEFAULT_MESSAGES[code],
        "request_id": request_id,
        "data": data if code is Code.OK else None,
    }


def success(request_id: str, data: Any) -> dict:
    return envelope(Code.OK, request_id, data)


def failure(error: ContractError, request_id: str) -> dict:
    """`error`'s envelope; a 1007 of a known kind says it in `data` (`{"error_type": …}`)."""
    body = envelope(error.code, request_id, None, error.message)
    if error.code is Code.SYSTEM_ERROR and error.error_type is not None:
        body["data"] = {ERROR_TYPE_KEY: error.error_type.value}
    return body


def answer_error_type(body: dict) -> ErrorType | None:
    """The kind an answer names (its `X-Error-Type`, host and gateway alike): a 1007's own;
    any other refusal is about the photo (`input_rejected`); a success or a host's busy
    answer names none."""
    code = body.get("code")
    if code == Code.OK or body.get(BUSY_KEY) is True:
        return None
    if code != Code.SYSTEM_ERROR:
        return ErrorType.INPUT_REJECTED
    return error_type_of(body)


def error_type_of(body: dict) -> ErrorType | None:
    """The kind a 1007 envelope names in its `data`; None for any other answer (or a kind
    this gateway does not know: it is treated as before kinds existed)."""
    data = body.get("data")
    if body.get("code") != Code.SYSTEM_ERROR or not isinstance(data, dict):
        return None
    name = data.get(ERROR_TYPE_KEY)
    return ErrorType(name) if isinstance(name, str) and name in ErrorType._value2member_map_ else None


def busy_envelope(request_id: str) -> dict:
    """A GPU host's answer (HTTP 503) to a job arriving while another runs: "busy elsewhere"."""
    return {**envelope(Code.SYSTEM_ERROR, request_id, message=MSG_HOST_BUSY), BUSY_KEY: True}


def is_envelope(body: Any) -> bool:
    """True for a JSON object shaped like an envelope with a known code."""
    if not isinstance(body, dict) or set(body) != ENVELOPE_KEYS:
        return False
    code = body["code"]
    return isinstance(code, int) and not isinstance(code, bool) and code in Code._value2member_map_


# -- the same shape as models (the document's, the end-to-end tests') -------------------------

RequestId = Annotated[
    str, Field(description="the client's X-Request-ID when it is 1–64 of A-Z a-z 0-9 . _ -, else the gateway's")
]


class _Envelope(BaseModel):
    model_config = ConfigDict(frozen=True)


class FailureData(BaseModel):
    """A 1007's `data` when a GPU host named what went wrong (gateway.md § Failure kinds)."""

    model_config = ConfigDict(extra="forbid")
    error_type: ErrorType = Field(description="the kind of failure; X-Error-Type says it too")


class Refusal(_Envelope):
    """Any other code: `message` says why, in Chinese (contract.md § Envelope); `data` is null,
    or on a GPU host's 1007 `{"error_type": …}` (gateway.md § Failure kinds)."""

    code: Annotated[
        Literal[tuple(int(code) for code in Code if code is not Code.OK)],  # type: ignore[valid-type]
        Field(
            description="1001 parameter, 1002 format, 1003 too large, 1004 resolution, 1005 no face, "
            "1006 several faces, 1007 system (retry later), 1008 not frontal"
        ),
    ]
    message: str
    request_id: RequestId
    data: FailureData | None


@functools.cache
def answer_model(data: type[BaseModel]) -> type[BaseModel]:
    """The envelope of an endpoint whose `data` is `data`: success (code 0) or a refusal."""
    success = type(
        f"{data.__name__.removesuffix('Data')}Success",
        (_Envelope,),
        {
            "__annotations__": {"code": Literal[0], "message": str, "request_id": RequestId, "data": data},
            "__module__": __name__,
            "__doc__": "code 0: `data` is the endpoint's answer.",
        },
    )
    return type(  # the class's name is the document's name for it
        f"{data.__name__.removesuffix('Data')}Answer",
        (RootModel[Annotated[success | Refusal, Field(discriminator=None)]],),  # type: ignore[valid-type]
        {"__module__": __name__, "__doc__": "The envelope: HTTP 200 whatever the code; read `code`."},
    )


def envelope_errors(name: str, answer: Any) -> str | None:
    """None when `answer` (a parsed JSON envelope) is what endpoint `name` may answer, else
    why not: the end-to-end tests check every real answer with it."""
    try:
        answer_model(endpoint(name).data).model_validate(answer)
    except ValidationError as error:
        return str(error)
    return None
