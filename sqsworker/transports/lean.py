"""The lean path for SQS's hot calls: a signed JSON request, without botocore's per-call work.

botocore spends about a millisecond of CPU on a receive of 10 (validating, serializing,
resolving the endpoint, emitting a dozen events, signing, parsing against the model);
the worker makes one receive and one delete batch per 10 messages, so that is most of
its CPU. ``LeanSQS`` sends ReceiveMessage, DeleteMessageBatch,
ChangeMessageVisibilityBatch and SendMessageBatch as SQS's JSON protocol, signed with
SigV4 (the signing key cached for its day), encoded and decoded with orjson, and keeps
from botocore everything that must stay exactly right:

- the credentials: the botocore session's own (its provider chain: environment,
  profiles, SSO, web identity, ECS and EC2 roles), frozen afresh for every request,
  so refreshable ones are refreshed as botocore would;
- the endpoint, the signing region and the service name: taken from a request botocore
  itself resolved and signed (``_learn()``: the queue check at start, or ``prime()``'s
  request that is answered in place of sending it), so ``--endpoint-url``,
  ``AWS_ENDPOINT_URL_SQS``, FIPS and dual-stack resolve as botocore resolves them;
- the HTTP session's settings: requests go over keep-alive connections of ``Wire``
  (transports/wire.py) with the TLS context, the certificates checked (its CA bundle,
  ``AWS_CA_BUNDLE``), the client certificate, the connect and read timeouts and the
  pool size of the client's own session, and raise botocore's exceptions for faults on
  the way; where a proxy applies (``HTTPS_PROXY``, ``NO_PROXY``, the client's proxies),
  they go through that session itself;
- the meaning of errors: an answer of 300 or more is parsed by botocore's own JSON parser
  and raised as the ``ClientError`` botocore would raise, so ``translate()`` maps it
  exactly as it maps botocore's;
- the parameters of a send batch (what the caller's messages carry): checked by
  botocore's validator, so what botocore refuses is refused alike (the other calls'
  parameters are sqsworker's own, and go unchecked).

Binary message attributes travel base64-encoded in the JSON protocol: they are encoded
and decoded here as botocore does (``bytes`` in Python).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import math
import threading
import time
import weakref
from collections.abc import Iterator, Mapping
from typing import Any, cast
from urllib.parse import urlsplit

import botocore
import orjson
from botocore.awsrequest import AWSPreparedRequest, AWSResponse
from botocore.compat import HTTPHeaders
from botocore.exceptions import (
    ClientError,
    HTTPClientError,
    NoCredentialsError,
    ParamValidationError,
)
from botocore.parsers import create_parser
from botocore.validate import validate_parameters
from urllib3 import HTTPHeaderDict

from ..version import __version__
from .loopwire import LoopWire
from .wire import Wire, tls_context

HOT_ACTIONS = frozenset(
    {"ReceiveMessage", "DeleteMessageBatch", "ChangeMessageVisibilityBatch", "SendMessageBatch"}
)
_CONTENT_TYPE = "application/x-amz-json-1.0"
_ALGORITHM = "AWS4-HMAC-SHA256"


# hashlib lets the GIL go to hash 2,048 bytes or more in one call: under load, a hand-over
# to another thread and a wait to get it back. A delete batch of ten real receipt handles
# is about that long; up to HASHED_WHOLE bytes are hashed in pieces that keep the GIL.
_PIECE = 2047
HASHED_WHOLE = 32_768  # longer: hashing takes long enough for another thread to run meanwhile


def payload_hash(body: bytes) -> str:
    """SHA-256 of ``body`` in hex, as SigV4 signs it."""
    if len(body) <= _PIECE or len(body) > HASHED_WHOLE:
        return hashlib.sha256(body).hexdigest()
    digest = hashlib.sha256()
    view = memoryview(body)
    for start in range(0, len(body), _PIECE):
        digest.update(view[start : start + _PIECE])
    return digest.hexdigest()


class Signer:
    """SigV4 for a POST of a JSON body to one endpoint, the signing key kept for its day."""

    def __init__(self, host: str, region: str, service: str) -> None:
        self.host, self.region, self.service = host, region, service
        self._keys: dict[tuple[str, str], bytes] = {}  # (secret key, day) -> signing key
        self._lock = threading.Lock()
        # The request time of this second, as SigV4 writes it (datetime's strftime cost
        # 4 µs a request); one tuple, which threads swap whole.
        self._second: tuple[int | None, str] = (None, "")

    def _key(self, secret: str, day: str) -> bytes:
        key = self._keys.get((secret, day))
        if key is None:
            key = ("AWS4" + secret).encode()
            for part in (day, self.region, self.service, "aws4_request"):
                key = hmac.new(key, part.encode(), hashlib.sha256).digest()
            with self._lock:
                if len(self._keys) > 8:  # rotated credentials, past days
                    self._keys.clear()
                self._keys[secret, day] = key
        return key

    def headers(
        self,
        target: str,
        body: bytes,
        access_key: str,
        secret_key: str,
        token: str | None,
        now: float,
    ) -> dict[str, str]:
        """The request's headers, ``Authorization`` included, signed at ``now`` (seconds
        since the epoch)."""
        second = math.floor(now)  # the second ``now`` falls in, before 1970 too
        cached = self._second
        if cached[0] != second:
            cached = self._second = (second, time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(second)))
        stamp = cached[1]
        day = stamp[:8]
        headers = {
            "Content-Type": _CONTENT_TYPE,
            "Host": self.host,
            "X-Amz-Date": stamp,
            "X-Amz-Target": target,
        }
        canonical = [
            f"content-type:{_CONTENT_TYPE}",
            f"host:{self.host}",
            f"x-amz-date:{stamp}",
        ]
        signed = "content-type;host;x-amz-date"
        if token:
            headers["X-Amz-Security-Token"] = token
            canonical.append(f"x-amz-security-token:{token}")
            signed += ";x-amz-security-token"
        canonical.append(f"x-amz-target:{target}")
        signed += ";x-amz-target"
        request = "\n".join(["POST", "/", "", *canonical, "", signed, payload_hash(body)])
        scope = f"{day}/{self.region}/{self.service}/aws4_request"
        to_sign = f"{_ALGORITHM}\n{stamp}\n{scope}\n{hashlib.sha256(request.encode()).hexdigest()}"
        signature = hmac.new(self._key(secret_key, day), to_sign.encode(), hashlib.sha256)
        headers["Authorization"] = (
            f"{_ALGORITHM} Credential={access_key}/{scope}, SignedHeaders={signed}, "
            f"Signature={signature.hexdigest()}"
        )
        return headers


class LeanSQS:
    """SQS's hot calls as lean signed requests, over a botocore client's own session."""

    def __init__(self, client: Any, credentials: Any) -> None:
        self._client = client
        self._credentials = credentials  # the session's (refreshable) credentials, or None
        self._http = client._endpoint.http_session  # botocore's URLLib3Session: TLS, proxies
        self._model = client.meta.service_model
        self._target = self._model.metadata["targetPrefix"]
        self._parser = create_parser(self._model.metadata["protocol"])
        self._agent = f"sqsworker/{__version__} botocore/{botocore.__version__} lean"
        self.url: str | None = None
        self._signer: Signer | None = None
        self.wire: Wire | None = None  # None: through botocore's session (a proxy applies)
        self._settings: dict[str, Any] = {}  # the wire's: where it connects, and how
        # Each event loop's connections (``call_async``), used and closed on that loop.
        self._loop_wires: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopWire]
        self._loop_wires = weakref.WeakKeyDictionary()
        client.meta.events.register("before-send.sqs", self._learn)

    def _learn(self, request: Any, **kwargs: Any) -> None:
        """From a request botocore resolved and signed: where to send, and how to sign."""
        if self._signer is not None:
            return
        authorization = request.headers.get("Authorization")
        if authorization is None:
            return
        if isinstance(authorization, bytes):
            authorization = authorization.decode()
        if not authorization.startswith(_ALGORITHM + " Credential="):
            return  # signed some other way (SigV4a): stay on botocore
        scope = authorization.split("Credential=", 1)[1].split(",", 1)[0].split("/")
        if len(scope) != 5:
            return
        parts = urlsplit(request.url)
        if parts.path not in ("", "/") or parts.query:
            return
        self.url = f"{parts.scheme}://{parts.netloc}/"
        if self._http._proxy_config.proxy_url_for(self.url) is None:
            self._settings = _wire_settings(self._http, self.url)
            self.wire = Wire(**self._settings)
        self._signer = Signer(_host(parts.scheme, parts.netloc), scope[2], scope[3])

    @property
    def ready(self) -> bool:
        return self._signer is not None

    def prime(self) -> None:
        """Learn where and how to send without sending: botocore resolves and signs a
        request (``GetQueueUrl``), and a ``before-send`` handler answers it in its place
        (botocore takes the first answer a handler gives). A copy of a transport in
        another process (a Spark task) thus makes its first calls lean, with no request
        spent and no connection of botocore's opened. On any failure (no credentials to
        sign with, say) the lean client learns from botocore's first call, as before."""
        if self.ready:
            return

        def answer(request: Any, **kwargs: Any) -> AWSResponse:
            self._learn(request)
            return AWSResponse(request.url, 200, HTTPHeaders(), _Canned(b"{}"))

        event, key = "before-send.sqs.GetQueueUrl", f"sqsworker-prime-{id(self)}"
        self._client.meta.events.register_first(event, answer, unique_id=key)
        try:
            self._client.get_queue_url(QueueName="sqsworker-prime")
        except Exception:  # learnt from the first real call instead
            pass
        finally:
            self._client.meta.events.unregister(event, unique_id=key)

    def call(self, action: str, params: Mapping[str, Any]) -> dict[str, Any]:
        """``action`` with ``params`` (botocore's shapes); returns what botocore would,
        without its ``ResponseMetadata``. Raises botocore's exceptions."""
        if self._credentials is None:
            raise NoCredentialsError()
        body, headers = self._request(action, params, self._credentials.get_frozen_credentials())
        wire = self.wire
        if wire is not None:
            answer = wire.post(_head(headers, body), body)
            return self._result(action, answer.status, answer.headers, answer.body)
        # a plain dict of headers: urllib3 takes it, and botocore's session reads it so
        assert self.url is not None
        request = AWSPreparedRequest("POST", self.url, cast(Any, headers), body, False)
        response = self._http.send(request)
        return self._result(action, response.status_code, response.headers, response.content)

    async def call_async(self, action: str, params: Mapping[str, Any]) -> dict[str, Any]:
        """``call`` for code on an event loop: over ``LoopWire`` connections of the
        running loop, so no thread waits on the answer. Where no such connection applies
        (a proxy), and while credentials are being refreshed (a call to STS, say), the
        call is made on a thread instead, so the loop never waits on it."""
        loop = asyncio.get_running_loop()
        credentials = self._credentials
        if self.wire is None or credentials is None:
            return await loop.run_in_executor(None, self.call, action, params)
        refresh_needed = getattr(credentials, "refresh_needed", None)
        if refresh_needed is not None and refresh_needed():
            frozen = await loop.run_in_executor(None, credentials.get_frozen_credentials)
        else:
            frozen = credentials.get_frozen_credentials()
        body, headers = self._request(action, params, frozen)
        wire = self._loop_wires.get(loop)
        if wire is None:
            wire = self._loop_wires[loop] = LoopWire(**self._settings)
        answer = await wire.post(_head(headers, body), body)
        return self._result(action, answer.status, answer.headers, answer.body)

    def close_loop_wire(self, loop: asyncio.AbstractEventLoop) -> None:
        """Close the connections of ``loop``'s ``LoopWire`` (on that loop's thread)."""
        wire = self._loop_wires.pop(loop, None)
        if wire is not None:
            wire.close()

    def _request(
        self, action: str, params: Mapping[str, Any], frozen: Any
    ) -> tuple[bytes, dict[str, str]]:
        """The signed request's body and headers."""
        signer = self._signer
        assert signer is not None and self.url is not None, "learn() has not seen a request"
        if frozen.access_key is None or frozen.secret_key is None:
            raise NoCredentialsError()
        if action == "SendMessageBatch":
            # what the caller's messages carry (attribute values of any type): refused as
            # botocore refuses it, not sent as orjson would write it (a datetime, an int)
            # nor raised as a TypeError; the other calls' parameters are sqsworker's own
            validate_parameters(params, self._model.operation_model(action).input_shape)
            params = _encode_binary_entries(params)
        try:
            body = orjson.dumps(params)
        except orjson.JSONEncodeError:  # text orjson refuses (a lone surrogate): as botocore
            try:
                body = json.dumps(params).encode()
            except (TypeError, ValueError) as exc:
                raise ParamValidationError(report=f"{action}: {exc}") from None
        headers = signer.headers(
            f"{self._target}.{action}",
            body,
            frozen.access_key,
            frozen.secret_key,
            frozen.token,
            time.time(),
        )
        headers["User-Agent"] = self._agent
        return body, headers

    def _result(self, action: str, status: int, headers: Any, content: bytes) -> dict[str, Any]:
        """What botocore would return for this answer, or the error it would raise."""
        if status >= 300:
            if isinstance(headers, dict):  # a wire's answer's
                headers = HTTPHeaderDict(headers)
            self._raise(action, status, headers, content)
        try:
            result: dict[str, Any] = orjson.loads(content) if content else {}
        except orjson.JSONDecodeError:
            result = _loads(content, status)
        if not isinstance(result, dict):
            text = f"the answer (HTTP {status}) is not a JSON object: {content[:200]!r}"
            raise HTTPClientError(error=ValueError(text))
        if action == "ReceiveMessage":
            _decode_binary_attributes(result)
        return result

    def _raise(self, action: str, status: int, headers: Any, body: bytes) -> None:
        """The error botocore would raise for this answer (its parser, its exception class)."""
        operation = self._model.operation_model(action)
        parsed = self._parser.parse(
            {"status_code": status, "headers": headers, "body": body}, operation.output_shape
        )
        parsed.setdefault("ResponseMetadata", {})["HTTPStatusCode"] = status
        # botocore picks the class by the JSON protocol's code (kept as QueryErrorCode when
        # SQS names the query-era code too, which becomes "Code")
        error_info = parsed.get("Error", {})
        code = error_info.get("QueryErrorCode") or error_info.get("Code")
        error: type[ClientError] = self._client.exceptions.from_code(code)
        raise error(parsed, action)


class _Canned:
    """The raw body of an answer no endpoint gave (``prime``)."""

    def __init__(self, body: bytes) -> None:
        self._body = body

    def stream(self, **kwargs: Any) -> Iterator[bytes]:
        yield self._body


def _wire_settings(http: Any, url: str) -> dict[str, Any]:
    """Connections to ``url`` as botocore's session ``http`` (a ``URLLib3Session``) makes
    them: its TLS context and certificate checks, its timeouts, its pool's size (for a
    ``Wire`` or a ``LoopWire``)."""
    parts = urlsplit(url)
    secure = parts.scheme == "https"
    timeout = http._timeout  # seconds, or urllib3's Timeout(connect, read)
    if isinstance(timeout, int | float):
        connect = read = float(timeout)
    else:
        connect, read = timeout.connect_timeout, timeout.read_timeout
    return {
        "url": url,
        "host": parts.hostname or "",
        "port": parts.port or (443 if secure else 80),
        "context": tls_context(http._verify, http._cert_file, http._key_file) if secure else None,
        "connect_timeout": connect,
        "read_timeout": read,
        "max_idle": http._max_pool_connections,
    }


def _head(headers: Mapping[str, str], body: bytes) -> bytes:
    """The request line and headers of a signed POST of ``body``, ending in a blank line."""
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return f"POST / HTTP/1.1\r\n{head}Content-Length: {len(body)}\r\n\r\n".encode()


def _loads(content: bytes, status: int) -> dict[str, Any]:
    """An answer orjson refused: Python's json reads what botocore reads (a lone surrogate's
    escape); anything else is garbled."""
    try:
        result = json.loads(content)
    except ValueError:
        # botocore would read this as an empty answer (no messages, no entries settled);
        # a garbled answer is a fault of the way there instead (as a reset would be:
        # translate() makes it a retryable ConnectionError)
        text = f"the answer (HTTP {status}) is not JSON: {content[:200]!r}"
        raise HTTPClientError(error=ValueError(text)) from None
    return cast(dict[str, Any], result)


def _host(scheme: str, netloc: str) -> str:
    """The Host header botocore signs: the URL's, without a default port."""
    default = {"https": ":443", "http": ":80"}.get(scheme)
    return netloc.removesuffix(default) if default else netloc


def _decode_binary_attributes(result: dict[str, Any]) -> None:
    for message in result.get("Messages", ()):
        for value in message.get("MessageAttributes", {}).values():
            if "BinaryValue" in value:
                value["BinaryValue"] = base64.b64decode(value["BinaryValue"])
            if "BinaryListValues" in value:
                value["BinaryListValues"] = [base64.b64decode(v) for v in value["BinaryListValues"]]


def _encode_binary_entries(params: Mapping[str, Any]) -> dict[str, Any]:
    entries = []
    for entry in params.get("Entries", ()):
        attributes = entry.get("MessageAttributes")
        if attributes and any(
            "BinaryValue" in v or "BinaryListValues" in v for v in attributes.values()
        ):
            entry = {**entry, "MessageAttributes": {k: _encoded(v) for k, v in attributes.items()}}
        entries.append(entry)
    return {**params, "Entries": entries}


def _encoded(value: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(value)
    if "BinaryValue" in out:
        out["BinaryValue"] = _b64(out["BinaryValue"])
    if "BinaryListValues" in out:
        out["BinaryListValues"] = [_b64(v) for v in out["BinaryListValues"]]
    return out


def _b64(value: bytes | bytearray | str) -> str:
    raw = value.encode() if isinstance(value, str) else bytes(value)
    return base64.b64encode(raw).decode()
