"""The SQS endpoints: `POST /` for both protocols (and `GET /`, a Query request
in the query string), and the queue URL itself (`/{account}/{queue}`, POST or
GET) for Query clients that post there. Other methods: 405 with `Allow`.

The protocol is chosen per request: `X-Amz-Target: AmazonSQS.<Action>` is the
AWS JSON 1.0 protocol; otherwise the form field `Action` is the Query protocol
(XML responses, or JSON ones to a client that accepts `application/json`).
Errors go out in the protocol's own shape. Where SQS's own answers differ from
what its documentation suggests, these follow the answers recorded against AWS:
a request with no Action is a 404 `<UnknownOperationException/>`, a queue URL
refuses the service's own actions (CreateQueue, ListQueues), and any action is
taken over a signed GET.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import uuid
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request, Response
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope

from app.asgi.access import REQUEST_ID, SQS_ACTION
from app.asgi.body_budget import SMALL_BODY, BodyBudget, ProvenCallers, address_of
from app.asgi.disconnect import client_gone
from app.asgi.lean import UNDO, Answer, Call, response_of, serves
from app.auth.guard import announces_body
from app.auth.scopes import EVERYONE, Principal
from app.auth.store import KeyStore
from app.config import Settings
from app.errors import LeaseqError
from app.sqs import protocol, sigv4
from app.sqs.actions import ACTIONS, NEEDS, READ_ONLY, Context
from app.sqs.errors import NO_QUEUE, SqsError, from_engine

_log = logging.getLogger(__name__)
_ACCOUNT = re.compile(r"^[0-9]{12}$")

router = APIRouter(tags=["sqs"], include_in_schema=False)


class _Request:
    """What the SQS door reads of a request."""

    __slots__ = ("body", "headers", "path", "query", "receive", "scope", "state")

    def __init__(self, scope: Scope, receive: Receive, body: bytes) -> None:
        self.scope = scope
        self.receive = receive
        self.body = body
        self.state = scope["app"].state
        self.headers = Headers(scope=scope)
        self.path: str = scope["path"]
        self.query: str = scope.get("query_string", b"").decode("latin-1")

    def base_url(self) -> str:
        scheme = self.scope.get("scheme", "http")
        host = self.headers.get("host")
        if host is None:  # HTTP/1.0: the address the request came in on
            name, port = self.scope.get("server") or ("localhost", 80)
            default = {"http": 80, "https": 443}.get(scheme)
            host = name if port == default else f"{name}:{port}"
        return f"{scheme}://{host}"


_SIGNER = "leaseq.sqs_signer"
"""The scope's key for what `before_body` found (a Signer)."""


def _is_json(headers: Headers) -> bool:
    return headers.get("x-amz-target") is not None or headers.get(
        "content-type", "").startswith("application/x-amz-json")


def _wants_json(headers: Headers) -> bool:
    """Whether a Query request asked for its answer in JSON, as SQS gives it then."""
    return "application/json" in headers.get("accept", "")


# Actions of the service, not of a queue: SQS refuses them on a queue URL.
_NOT_ON_A_QUEUE_URL = frozenset({"CreateQueue", "ListQueues"})


Signer = tuple[sigv4.Signed, Principal, str, dict[str, list[str]]]
"""What a request's credentials came to: its signature's parts, whose key, that
key's secret, its headers by name (for checking the signature over the body)."""


async def _credentials(scope: Scope, state: Any, is_json: bool) -> Signer | None:
    """Everything of the credentials the headers tell: their form, date window and
    region, that the key exists. None while no key exists (the door is open);
    SqsError (or the engine's error) otherwise. Needs no body."""
    keys: KeyStore = state.keys
    settings: Settings = state.settings
    await keys.ensure()
    if not keys.enforcing:
        return None
    by_name = sigv4.headers_by_name(
        [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
    )
    query = scope.get("query_string", b"").decode("latin-1")
    signed = sigv4.parse(by_name, query, now=datetime.now(UTC), json_protocol=is_json)
    sigv4.check_region(signed, settings.sqs_region)
    if signed.presigned and announces_body(dict(scope["headers"])):
        # A presigned URL signs its query string and nothing else: parameters in
        # a body would ride on someone else's signature (a URL signed for
        # GetQueueAttributes, posted with Action=PurgeQueue in its body).
        raise SqsError(
            "AccessDenied",
            "A presigned request carries all its parameters in its signed query "
            "string; this one has a body.",
        )
    found = await keys.signing_secret(signed.key)
    if found is None:
        raise SqsError(
            "InvalidClientTokenId", "The security token included in the request is invalid."
        )
    principal, secret = found
    return signed, principal, secret, by_name


async def before_body(scope: Scope, state: Any) -> Answer | None:
    """The credentials checked before a byte of the body is read: an
    unauthenticated request is refused for the price of its headers, and its
    connection closed rather than its body read. The signature itself covers the
    body and is checked after (`_authenticate`)."""
    headers = Headers(scope=scope)
    is_json = _is_json(headers)
    try:
        signer = await _credentials(scope, state, is_json)
        if signer is not None:
            await _reserve_body(scope, state, headers, signer[0].key)
    except (SqsError, LeaseqError) as exc:
        scope[SQS_ACTION] = "unknown"
        error = from_engine(exc)
        answer = _error(error, is_json, scope.get(REQUEST_ID) or str(uuid.uuid4()),
                        query_json=not is_json and _wants_json(headers))
        more: tuple[tuple[bytes, bytes], ...] = ()
        if error.name == "RequestThrottled":
            more = ((b"retry-after", b"1"),)
        if announces_body(dict(scope["headers"])):
            more = (*more, (b"connection", b"close"))
        return dataclasses.replace(answer, headers=(*answer.headers, *more)) if more else answer
    if signer is not None:
        scope[_SIGNER] = signer
    return None


async def _reserve_body(scope: Scope, state: Any, headers: Headers, key_id: str) -> None:
    """The body's share of the bytes this process holds for requests not proven
    yet (app/asgi/body_budget.py), reserved before a byte of it is read; given
    back once the signature is checked (`_authenticate`) or the request ends.
    A body of no declared length reserves the most the door takes; a small one,
    nothing. (The parser refuses a Content-Length beside a Transfer-Encoding.)"""
    settings: Settings = state.settings
    declared = headers.get("content-length")
    # ASCII digits, converted from what matched (the parser checked them already;
    # this does not lean on it).
    number = None if declared is None else _LENGTH.fullmatch(declared)
    if number is not None:
        size = int(number[1])
    else:
        size = settings.request_limit() if "transfer-encoding" in headers else 0
    if size <= SMALL_BODY:
        return
    address = address_of(scope.get("client"))
    proven: ProvenCallers = state.proven
    if proven.knows(address, key_id):
        # A caller proven lately from this address draws on a budget of its own.
        await _reserve(scope, state.unproven_known, size, address, settings)
        return
    # A stranger: besides its address's share, its key id's. Whoever forges one
    # key id (key ids are not secret) holds at most one full request of this
    # budget, whatever addresses it comes from; strangers naming other keys keep
    # the rest.
    size = min(size, settings.request_limit())
    by_key: dict[str, int] = state.unproven_by_key
    held = by_key.get(key_id, 0)
    if held + size > settings.request_limit():
        raise _throttled()
    by_key[key_id] = held + size

    def unclaim() -> None:
        left = by_key.get(key_id, 0) - size
        if left > 0:
            by_key[key_id] = left
        else:
            by_key.pop(key_id, None)

    try:
        await _reserve(scope, state.unproven, size, address, settings)
    except BaseException:
        unclaim()
        raise
    release = scope[UNDO]

    def undo() -> None:
        release()
        unclaim()

    scope[UNDO] = undo


_LENGTH = re.compile(r"\s*([0-9]{1,19})\s*", re.ASCII)


async def _reserve(scope: Scope, budget: BodyBudget, size: int, address: str,
                   settings: Settings) -> None:
    reservation = await budget.reserve(size, address, settings.unproven_body_wait_seconds)
    if reservation is None:
        raise _throttled()
    scope[UNDO] = reservation.release


def _throttled() -> SqsError:
    return SqsError(
        "RequestThrottled",
        "Too many requests whose signature is not checked yet are being read; retry later.",
    )


async def _authenticate(request: _Request, is_json: bool) -> tuple[Principal, str]:
    """(who, their sender id) of a request: its credentials (as `before_body` found
    them, else checked now), then the signature over the body too, before the
    body is parsed."""
    signer: Signer | None = request.scope.get(_SIGNER)
    if signer is None:
        signer = await _credentials(request.scope, request.state, is_json)
    if signer is None:
        # Open (no key exists): any access key is accepted as the sender's id.
        settings: Settings = request.state.settings
        return EVERYONE, sigv4.access_key(request.headers.get("authorization")) or (
            settings.sqs_account_id
        )
    signed, principal, secret, by_name = signer
    try:
        sigv4.check(signed, secret=secret, method=request.scope["method"], path=request.path,
                    query_string=request.query, by_name=by_name, body=request.body)
    finally:
        _give_back(request.scope)  # proven or refused: its body is no longer unproven
    return principal, signed.key


def _give_back(scope: Scope) -> None:
    undo = scope.pop(UNDO, None)
    if undo is not None:
        undo()


async def _handle(request: _Request, path_queue: str | None) -> Answer:
    # One id for the access line and the SQS answer (x-amzn-requestid, RequestId).
    request_id = request.scope.get(REQUEST_ID) or str(uuid.uuid4())
    request.scope[SQS_ACTION] = "unknown"  # until it is one this door serves
    body = request.body
    target = request.headers.get("x-amz-target")
    is_json = _is_json(request.headers)
    query_json = not is_json and _wants_json(request.headers)
    action: str | None = None
    try:
        principal, sender = await _authenticate(request, is_json)
        if is_json:
            if not target or not target.startswith(protocol.TARGET_PREFIX):
                raise SqsError(
                    "UnknownOperationException", "X-Amz-Target must be AmazonSQS.<Action>."
                )
            action = target[len(protocol.TARGET_PREFIX):]
            if action not in ACTIONS:
                raise SqsError("UnknownOperationException", f"Unknown operation {action[:100]}.")
            params = protocol.parse_json(body)
        else:
            action, params = protocol.parse_form(protocol.form_pairs(body, request.query))
            query_json = protocol.wants_json(params) or query_json
            if not action:
                # SQS's answer, in XML even to a client that accepts JSON.
                return Answer(404, protocol.UNKNOWN_OPERATION, _XML,
                              ((b"x-amzn-requestid", request_id.encode()),))
            if path_queue is not None and action in _NOT_ON_A_QUEUE_URL:
                raise SqsError(
                    "InvalidAction", f"The action {action} is not valid for this endpoint."
                )
        handler = ACTIONS.get(action)
        if handler is None:
            raise SqsError(
                "InvalidAction", f"The action {action[:100]} is not valid for this endpoint."
            )
        if (request.scope["method"] == "GET" and action not in READ_ONLY
                and not _signed(request)):
            # SQS takes every action over GET. A GET that carries no signature at
            # all is what a page of another site can make a browser send (an
            # <img>); one with an Authorization header or a presigned query string
            # is not, so it is taken, as SQS takes it.
            raise SqsError(
                "UnsupportedOperation",
                f"{action} changes state and is not taken over an unsigned GET: sign "
                f"it (SigV4, in the Authorization header or presigned) or send a POST.",
            )
        needs = NEEDS.get(action)
        if needs is None:  # default deny: an action without a declaration
            raise SqsError("AccessDenied", f"No key may call {action[:100]}.")
        needs.check_request_line(principal, None)
        request.scope[SQS_ACTION] = action
        request.state.limiter.take(principal)
        if principal is not EVERYONE:
            # Signed, allowed and within its rate: this address and key are proven
            # (app/asgi/body_budget.py); a signature alone, refused, proves nothing.
            proven: ProvenCallers = request.state.proven
            proven.prove(address_of(request.scope.get("client")), sender)
        settings: Settings = request.state.settings
        ctx = Context(
            service=request.state.service,
            redrives=request.state.redrives,
            # What clients are told queue URLs are: the configured public base
            # (a proxy's), else what this request addressed.
            base_url=settings.public_url or request.base_url(),
            account=settings.sqs_account_id,
            region=settings.sqs_region,
            sender_id=sender,
            path_queue=path_queue,
            principal=principal,
            needs=needs,
        )
        with request.state.limiter.running(principal):
            async with client_gone(request.receive) as gone:
                ctx.gone = gone
                result = await handler(ctx, params)
    except (SqsError, LeaseqError) as exc:
        return _error(from_engine(exc), is_json, request_id, query_json=query_json)
    except Exception:
        _log.exception("SQS action %s failed", action)
        return _error(SqsError("InternalError", "An internal error occurred."), is_json,
                      request_id, query_json=query_json)
    headers = ((b"x-amzn-requestid", request_id.encode()),)
    if is_json:
        return Answer(200, protocol.json_result(result), _JSON, headers)
    assert action is not None
    if query_json:
        return Answer(200, protocol.query_json_result(action, result, request_id),
                      _QUERY_JSON, headers)
    return Answer(200, protocol.xml_result(action, result, request_id), _XML, headers)


def _signed(request: _Request) -> bool:
    # With keys, the signature was checked already. Open, nothing is checked, so
    # the signature's form is what counts: a page can name X-Amz-Signature in a
    # link, never set an Authorization header (CORS asks first).
    return bool(request.headers.get("authorization")) or sigv4.is_whole_presigned(
        request.query, now=datetime.now(UTC))


_JSON = protocol.JSON_CONTENT_TYPE.encode()
_XML = f"{protocol.XML_CONTENT_TYPE}; charset=utf-8".encode()  # as Starlette says text
_QUERY_JSON = protocol.QUERY_JSON_CONTENT_TYPE.encode()


def _error(error: SqsError, is_json: bool, request_id: str, *, query_json: bool = False) -> Answer:
    headers = [(b"x-amzn-requestid", request_id.encode())]
    if is_json:
        content, extra = protocol.json_error(error)
        headers.extend((k.lower().encode("latin-1"), v.encode("latin-1"))
                       for k, v in extra.items())
        return Answer(error.status, content, _JSON, tuple(headers))
    if query_json:
        return Answer(error.status, protocol.query_json_error(error, request_id), _QUERY_JSON,
                      tuple(headers))
    return Answer(error.status, protocol.xml_error(error, request_id), _XML, tuple(headers))


async def _serve_root(call: Call) -> Answer:
    return await _handle(_Request(call.scope, call.receive, call.body), None)


@router.api_route("/", methods=["GET", "POST"])
@serves(_serve_root, before_body=before_body)
async def sqs_root() -> None:
    """Both SQS protocols (served on the lean path: app/asgi/lean.py); a Query
    request may also be a GET, its parameters in the query string, as AWS takes it."""


@router.api_route("/{account}/{queue}", methods=["GET", "POST"])
async def sqs_queue_url(account: str, queue: str, request: Request) -> Response:
    """A queue URL: Query requests posted (or sent as GET) to it name its queue."""
    settings: Settings = request.app.state.settings
    if not _ACCOUNT.fullmatch(account):
        raise StarletteHTTPException(404, "Not Found")
    if account != settings.sqs_account_id:
        is_json = _is_json(request.headers)
        return response_of(_error(
            SqsError("QueueDoesNotExist", NO_QUEUE), is_json, str(uuid.uuid4()),
            query_json=not is_json and _wants_json(request.headers),
        ))
    refused = await before_body(request.scope, request.app.state)
    if refused is not None:
        return response_of(refused)
    try:
        try:
            body = await request.body()
        except ClientDisconnect:
            # Gone, or cut off for a late body (app/asgi/header_limits.py): no one
            # hears this answer, and it is not the service's error.
            return Response(status_code=400)
        return response_of(await _handle(_Request(request.scope, request.receive, body), queue))
    finally:
        _give_back(request.scope)
