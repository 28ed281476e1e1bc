"""`shared.errors.reason`: the first message down the exception chain."""

from __future__ import annotations

import ssl

from shared.errors import reason


def chained() -> BaseException:
    try:
        try:
            raise ssl.SSLCertVerificationError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed")
        except ssl.SSLError as error:
            raise OSError() from error  # an empty wrapper, as trio's BrokenResourceError
    except OSError:
        try:
            raise ConnectionError()  # … inside another one, as httpcore's ConnectError
        except ConnectionError as outer:
            return outer


def test_an_empty_wrapper_is_named_by_its_cause() -> None:
    assert reason(chained()) == "SSLCertVerificationError: [SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed"


def test_a_message_of_its_own_is_kept() -> None:
    assert reason(TimeoutError("no answer in 3s")) == "TimeoutError: no answer in 3s"


def test_nothing_anywhere_gives_the_type() -> None:
    assert reason(ConnectionResetError()) == "ConnectionResetError"
