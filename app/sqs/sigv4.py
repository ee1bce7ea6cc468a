"""AWS Signature Version 4, checked on the server (header-based Authorization).

A request must carry `Authorization: AWS4-HMAC-SHA256 Credential=KEY/DATE/
REGION/SERVICE/aws4_request, SignedHeaders=..., Signature=...` made with the
key's secret over the canonical request, which includes the SHA-256 of the
body. The region must be the service's (LEASEQ_SQS_REGION); the service `sqs`.

Checked in two steps, so that a request is refused before its body is read
into parameters: `parse` the header (its form; X-Amz-Date within 15 minutes
of the server's clock; `host`, `x-amz-date` and, for the JSON protocol,
`x-amz-target` and `content-type` among the signed headers, so a captured
signature cannot be re-sent as another action), then `check` the signature
with the key's secret.

A presigned request (a Query `GET` with the signature in its query string:
X-Amz-Algorithm, -Credential, -Date, -Expires, -SignedHeaders, -Signature, as
botocore's generate_presigned_url writes it) is checked the same way, with
`host` signed, and honoured for X-Amz-Expires or 15 minutes from X-Amz-Date,
whichever ends first: a leaked URL is no longer good than a captured header.
It has no body: every parameter is in the signed query string.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qsl, quote

from app.sqs.errors import SqsError

ALGORITHM = "AWS4-HMAC-SHA256"
_AUTH = re.compile(
    r"^AWS4-HMAC-SHA256\s+Credential=(?P<credential>[^,\s]+)\s*,\s*"
    r"SignedHeaders=(?P<signed>[^,\s]+)\s*,\s*Signature=(?P<signature>[0-9a-f]{64})\s*$"
)
_AMZ_DATE = re.compile(r"^\d{8}T\d{6}Z$")
MAX_SKEW = timedelta(minutes=15)
_CREDENTIAL = re.compile(
    r"^(?P<key>[^/]+)/(?P<date>\d{8})/(?P<region>[^/]+)/(?P<service>[^/]+)/aws4_request$"
)


def access_key(authorization: str | None) -> str | None:
    """The access key a request names, signed or not (the sender's id)."""
    if not authorization:
        return None
    match = re.search(r"Credential=([^/,\s]+)/", authorization)
    return None if match is None else match.group(1)


def _hmac(key: bytes, message: str) -> bytes:
    return hmac.new(key, message.encode("utf-8"), hashlib.sha256).digest()


def _canonical_query(query_string: str, drop: str | None = None) -> str:
    pairs = [(k, v) for k, v in parse_qsl(query_string, keep_blank_values=True) if k != drop]
    encoded = sorted((quote(k, safe="-_.~"), quote(v, safe="-_.~")) for k, v in pairs)
    return "&".join(f"{k}={v}" for k, v in encoded)


@dataclass(frozen=True)
class Signed:
    """The parts of a request's Authorization header, checked for form."""

    key: str
    date: str
    region: str
    service: str
    signed_headers: str
    signature: str
    amz_date: str
    presigned: bool = False


def _header(by_name: Mapping[str, list[str]], name: str) -> str:
    return (by_name.get(name) or [""])[0]


def headers_by_name(headers: Sequence[tuple[str, str]]) -> dict[str, list[str]]:
    by_name: dict[str, list[str]] = {}
    for name, value in headers:
        by_name.setdefault(name.lower(), []).append(value)
    return by_name


def is_presigned(query_string: str) -> bool:
    """Whether a request carries (or claims to carry) its signature in its URL."""
    return "X-Amz-Signature=" in query_string or "X-Amz-Algorithm=" in query_string


def is_whole_presigned(query_string: str, *, now: datetime) -> bool:
    """Whether a request's URL carries a presigned signature whole: every part in
    form, X-Amz-Date in its window, `host` signed. Open (no key exists), no
    signature is checked; this is what tells a presigned URL from a link that
    only names X-Amz-Signature, which any page can make a browser follow."""
    try:
        _parse_presigned(query_string, now=now)
    except SqsError:
        return False
    return True


def parse(
    by_name: Mapping[str, list[str]], query_string: str, *, now: datetime, json_protocol: bool
) -> Signed:
    """The signature's parts, once its form, its date and the headers it covers
    pass; SqsError otherwise. Nothing here needs the secret or the body."""
    if is_presigned(query_string):
        if json_protocol:
            raise SqsError(
                "IncompleteSignature",
                "A presigned (query-string) signature is for the Query protocol's GET; "
                "sign the Authorization header of a JSON request.",
            )
        return _parse_presigned(query_string, now=now)
    authorization = _header(by_name, "authorization")
    if not authorization:
        raise SqsError(
            "MissingAuthenticationToken", "Request is missing Authentication Token"
        )
    match = _AUTH.match(authorization)
    if match is None:
        raise SqsError(
            "IncompleteSignature",
            f"Authorization header requires {ALGORITHM} with Credential, SignedHeaders "
            f"and Signature.",
        )
    amz_date = _header(by_name, "x-amz-date")
    scope = _scope(match["credential"], amz_date)
    if abs(now - _signed_at(amz_date)) > MAX_SKEW:
        raise _expired(amz_date, now)
    signed = match["signed"].split(";")
    needed = ["host", "x-amz-date"]
    if json_protocol:
        needed += ["x-amz-target", "content-type"]
    missing = [name for name in needed if name not in signed]
    if missing:
        raise SqsError(
            "SignatureDoesNotMatch",
            f"The signature must cover the headers {', '.join(missing)}.",
        )
    return Signed(
        key=scope["key"], date=scope["date"], region=scope["region"],
        service=scope["service"], signed_headers=match["signed"],
        signature=match["signature"], amz_date=amz_date,
    )


def check_region(signed: Signed, region: str) -> None:
    """The credential scope names this service's region (LEASEQ_SQS_REGION), as
    AWS requires: a signature made for another region is not one for this."""
    if signed.region != region:
        raise SqsError(
            "SignatureDoesNotMatch",
            f"Credential should be scoped to a valid region, not '{signed.region[:40]}'. "
            f"This service's region is {region} (LEASEQ_SQS_REGION).",
        )


def _scope(credential: str, amz_date: str) -> re.Match[str]:
    """The credential's scope (KEY/DATE/REGION/sqs/aws4_request), checked with the
    X-Amz-Date that must fall on its day: the same for a header and a presigned URL."""
    scope = _CREDENTIAL.match(credential)
    if scope is None:
        raise SqsError("IncompleteSignature", "The credential scope is malformed.")
    if scope["service"] != "sqs":
        raise SqsError("SignatureDoesNotMatch", "The credential scope must name service sqs.")
    if not _AMZ_DATE.fullmatch(amz_date) or not amz_date.startswith(scope["date"]):
        raise SqsError(
            "IncompleteSignature", "X-Amz-Date must be YYYYMMDDTHHMMSSZ of the credential's day."
        )
    return scope


def _signed_at(amz_date: str) -> datetime:
    try:
        return datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    except ValueError:
        raise SqsError("IncompleteSignature", "X-Amz-Date is not a valid time.") from None


def _expired(amz_date: str, now: datetime) -> SqsError:
    stamp = now.strftime("%Y%m%dT%H%M%SZ")
    return SqsError(
        "RequestExpired",
        f"Signature expired: {amz_date} is more than 15 minutes from the server's "
        f"time {stamp}.",
    )


_PRESIGNED = ("X-Amz-Algorithm", "X-Amz-Credential", "X-Amz-Date", "X-Amz-Expires",
              "X-Amz-SignedHeaders", "X-Amz-Signature")
MAX_EXPIRES = 604800  # seconds: SigV4's own bound on X-Amz-Expires (7 days)


def _parse_presigned(query_string: str, *, now: datetime) -> Signed:
    """A presigned request's signature parts, once their form and time pass."""
    given: dict[str, str] = {}
    for name, value in parse_qsl(query_string, keep_blank_values=True):
        if name in _PRESIGNED:
            if name in given:
                raise SqsError("IncompleteSignature", f"{name} is given twice.")
            given[name] = value
    missing = [name for name in _PRESIGNED if not given.get(name)]
    if missing:
        raise SqsError(
            "IncompleteSignature",
            f"A presigned request needs the query parameters {', '.join(missing)}.",
        )
    if given["X-Amz-Algorithm"] != ALGORITHM:
        raise SqsError("IncompleteSignature", f"X-Amz-Algorithm must be {ALGORITHM}.")
    amz_date = given["X-Amz-Date"]
    scope = _scope(given["X-Amz-Credential"], amz_date)
    expires = given["X-Amz-Expires"]
    # ASCII digits, few enough for int(): str.isdigit() also takes "²", and a
    # thousands of digits long number, both of which int() refuses.
    if not re.fullmatch(r"[0-9]{1,7}", expires) or not 1 <= int(expires) <= MAX_EXPIRES:
        raise SqsError(
            "IncompleteSignature", f"X-Amz-Expires must be 1 to {MAX_EXPIRES} seconds."
        )
    signed_at = _signed_at(amz_date)
    valid_for = min(timedelta(seconds=int(expires)), MAX_SKEW)
    if now < signed_at - MAX_SKEW or now > signed_at + valid_for:
        raise _expired(amz_date, now)
    if not re.fullmatch(r"[0-9a-f]{64}", given["X-Amz-Signature"]):
        raise SqsError("IncompleteSignature", "X-Amz-Signature must be 64 hex digits.")
    signed_headers = given["X-Amz-SignedHeaders"]
    if "host" not in signed_headers.split(";"):
        raise SqsError("SignatureDoesNotMatch", "The signature must cover the headers host.")
    return Signed(
        key=scope["key"], date=scope["date"], region=scope["region"],
        service=scope["service"], signed_headers=signed_headers,
        signature=given["X-Amz-Signature"], amz_date=amz_date, presigned=True,
    )


def check(
    signed: Signed,
    *,
    secret: str,
    method: str,
    path: str,
    query_string: str,
    by_name: Mapping[str, list[str]],
    body: bytes,
) -> None:
    """SqsError unless `secret` made the signature over this request."""
    canonical_headers = "".join(
        f"{name}:{','.join(' '.join(v.split()) for v in by_name.get(name, []))}\n"
        for name in signed.signed_headers.split(";")
    )
    query = _canonical_query(query_string, drop="X-Amz-Signature" if signed.presigned else None)
    payloads = [hashlib.sha256(body).hexdigest()]
    if signed.presigned:
        payloads.append("UNSIGNED-PAYLOAD")  # what some clients sign a presigned URL with
    for payload in payloads:
        canonical_request = "\n".join([
            method, quote(path or "/", safe="/~"), query, canonical_headers,
            signed.signed_headers, payload,
        ])
        if hmac.compare_digest(_signature(signed, secret, canonical_request), signed.signature):
            return
    raise SqsError(
        "SignatureDoesNotMatch",
        "The request signature we calculated does not match the signature you provided.",
    )


def _signature(signed: Signed, secret: str, canonical_request: str) -> str:
    credential_scope = "/".join([signed.date, signed.region, signed.service, "aws4_request"])
    string_to_sign = "\n".join(
        [
            ALGORITHM,
            signed.amz_date,
            credential_scope,
            hashlib.sha256(canonical_request.encode("utf-8")).hexdigest(),
        ]
    )
    signing_key = _hmac(("AWS4" + secret).encode("utf-8"), signed.date)
    for part in (signed.region, signed.service, "aws4_request"):
        signing_key = _hmac(signing_key, part)
    return hmac.new(signing_key, string_to_sign.encode("utf-8"), hashlib.sha256).hexdigest()
