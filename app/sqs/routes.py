"""The SQS endpoints: `POST /` for both protocols, and the queue URL itself
(`/{account}/{queue}`, POST or GET) for Query clients that post there.

The protocol is chosen per request: `X-Amz-Target: AmazonSQS.<Action>` is the
AWS JSON 1.0 protocol; otherwise the form field `Action` is the Query protocol
(XML responses). Errors go out in the protocol's own shape.
"""

from __future__ import annotations

import logging
import re
import uuid
from datetime import UTC, datetime

from fastapi import APIRouter, Request, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.asgi.disconnect import client_gone
from app.auth.scopes import EVERYONE, Principal
from app.auth.store import KeyStore
from app.config import Settings
from app.errors import LeaseqError
from app.sqs import protocol, sigv4
from app.sqs.actions import ACTIONS, SCOPES, Context
from app.sqs.errors import SqsError, from_engine

_log = logging.getLogger(__name__)
_ACCOUNT = re.compile(r"^[0-9]{12}$")

router = APIRouter(tags=["sqs"], include_in_schema=False)


async def _authenticate(request: Request, body: bytes, is_json: bool) -> tuple[Principal, str]:
    """(who, their sender id) of a request, checked before its body is parsed."""
    keys: KeyStore = request.app.state.keys
    settings: Settings = request.app.state.settings
    await keys.ensure()
    if not keys.enforcing:
        # Open (no key exists): any access key is accepted as the sender's id.
        return EVERYONE, sigv4.access_key(request.headers.get("authorization")) or (
            settings.sqs_account_id
        )
    by_name = sigv4.headers_by_name(
        [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.scope["headers"]]
    )
    query = request.url.query
    signed = sigv4.parse(by_name, query, now=datetime.now(UTC), json_protocol=is_json)
    found = await keys.signing_secret(signed.key)
    if found is None:
        raise SqsError(
            "InvalidClientTokenId", "The security token included in the request is invalid."
        )
    principal, secret = found
    sigv4.check(signed, secret=secret, method=request.method, path=request.url.path,
                query_string=query, by_name=by_name, body=body)
    return principal, signed.key


async def _handle(request: Request, path_queue: str | None) -> Response:
    request_id = str(uuid.uuid4())
    body = await request.body()
    target = request.headers.get("x-amz-target")
    is_json = target is not None or request.headers.get("content-type", "").startswith(
        "application/x-amz-json"
    )
    action: str | None = None
    try:
        principal, sender = await _authenticate(request, body, is_json)
        if is_json:
            if not target or not target.startswith(protocol.TARGET_PREFIX):
                raise SqsError("InvalidAction", "X-Amz-Target must be AmazonSQS.<Action>.")
            action = target[len(protocol.TARGET_PREFIX):]
            params = protocol.parse_json(body)
        else:
            action, params = protocol.parse_form(
                protocol.form_pairs(body, request.url.query)
            )
            if not action:
                raise SqsError("MissingAction", "The request must contain an Action.")
        handler = ACTIONS.get(action)
        if handler is None:
            raise SqsError(
                "InvalidAction", f"The action {action[:100]} is not valid for this endpoint."
            )
        request.app.state.limiter.take(principal)
        settings: Settings = request.app.state.settings
        ctx = Context(
            service=request.app.state.service,
            redrives=request.app.state.redrives,
            base_url=f"{request.url.scheme}://{request.headers.get('host', request.url.netloc)}",
            account=settings.sqs_account_id,
            region=settings.sqs_region,
            sender_id=sender,
            path_queue=path_queue,
            principal=principal,
            need=SCOPES[action],
        )
        async with client_gone(request.receive) as gone:
            ctx.gone = gone
            result = await handler(ctx, params)
    except (SqsError, LeaseqError) as exc:
        return _error(from_engine(exc), is_json, request_id)
    except Exception:
        _log.exception("SQS action %s failed", action)
        return _error(SqsError("InternalError", "An internal error occurred."), is_json, request_id)
    headers = {"x-amzn-RequestId": request_id}
    if is_json:
        return Response(protocol.json_result(result), media_type=protocol.JSON_CONTENT_TYPE,
                        headers=headers)
    assert action is not None
    return Response(protocol.xml_result(action, result, request_id),
                    media_type=protocol.XML_CONTENT_TYPE, headers=headers)


def _error(error: SqsError, is_json: bool, request_id: str) -> Response:
    headers = {"x-amzn-RequestId": request_id}
    if is_json:
        content, extra = protocol.json_error(error)
        return Response(content, status_code=error.status,
                        media_type=protocol.JSON_CONTENT_TYPE, headers={**headers, **extra})
    return Response(protocol.xml_error(error, request_id), status_code=error.status,
                    media_type=protocol.XML_CONTENT_TYPE, headers=headers)


@router.post("/")
async def sqs_root(request: Request) -> Response:
    """Both SQS protocols."""
    return await _handle(request, None)


@router.api_route("/{account}/{queue}", methods=["GET", "POST"])
async def sqs_queue_url(account: str, queue: str, request: Request) -> Response:
    """A queue URL: Query requests posted (or sent as GET) to it name its queue."""
    settings: Settings = request.app.state.settings
    if not _ACCOUNT.fullmatch(account):
        raise StarletteHTTPException(404, "Not Found")
    if account != settings.sqs_account_id:
        return _error(SqsError("QueueDoesNotExist", "The specified queue does not exist."),
                      request.headers.get("x-amz-target") is not None, str(uuid.uuid4()))
    return await _handle(request, queue)


