"""AWS Signature Version 4, checked on the server (header-based Authorization).

With no credentials configured any request is accepted (its access key, if
any, is only the sender's id). With credentials, a request must carry
`Authorization: AWS4-HMAC-SHA256 Credential=KEY/DATE/REGION/SERVICE/aws4_request,
SignedHeaders=..., Signature=...` made with one of their secrets over the
canonical request, which includes the SHA-256 of the body. The region and the
service are the ones of the credential scope (any region; the service must be
`sqs`). Presigned URLs (the signature in the query string) are not accepted.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping, Sequence
from urllib.parse import parse_qsl, quote

from app.sqs.errors import SqsError

ALGORITHM = "AWS4-HMAC-SHA256"
_AUTH = re.compile(
    r"^AWS4-HMAC-SHA256\s+Credential=(?P<credential>[^,\s]+)\s*,\s*"
    r"SignedHeaders=(?P<signed>[^,\s]+)\s*,\s*Signature=(?P<signature>[0-9a-f]{64})\s*$"
)
_CREDENTIAL = re.compile(
    r"^(?P<key>[^/]+)/(?P<date>\d{8})/(?P<region>[^/]+)/(?P<service>[^/]+)/aws4_request$"
)


def parse_credentials(text: str) -> dict[str, str]:
    """`KEY1:secret1,KEY2:secret2` -> {key: secret}."""
    pairs: dict[str, str] = {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        key, sep, secret = item.partition(":")
        if not sep or not key.strip() or not secret.strip():
            raise ValueError("LEASEQ_SQS_CREDENTIALS is ACCESS_KEY:SECRET pairs, comma-separated")
        pairs[key.strip()] = secret.strip()
    if not pairs:
        raise ValueError("LEASEQ_SQS_CREDENTIALS names no access key")
    return pairs


def access_key(authorization: str | None) -> str | None:
    """The access key a request names, signed or not (the sender's id)."""
    if not authorization:
        return None
    match = re.search(r"Credential=([^/,\s]+)/", authorization)
    return None if match is None else match.group(1)


def _hmac(key: bytes, message: str) -> bytes:
    return hmac.new(key, message.encode("utf-8"), hashlib.sha256).digest()


def _canonical_query(query_string: str) -> str:
    pairs = parse_qsl(query_string, keep_blank_values=True)
    encoded = sorted((quote(k, safe="-_.~"), quote(v, safe="-_.~")) for k, v in pairs)
    return "&".join(f"{k}={v}" for k, v in encoded)


def verify(
    *,
    credentials: Mapping[str, str],
    method: str,
    path: str,
    query_string: str,
    headers: Sequence[tuple[str, str]],
    body: bytes,
) -> str:
    """The access key of a correctly signed request; SqsError otherwise."""
    by_name: dict[str, list[str]] = {}
    for name, value in headers:
        by_name.setdefault(name.lower(), []).append(value)
    authorization = (by_name.get("authorization") or [""])[0]
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
    scope = _CREDENTIAL.match(match["credential"])
    if scope is None:
        raise SqsError("IncompleteSignature", "The credential scope is malformed.")
    key = scope["key"]
    secret = credentials.get(key)
    if secret is None:
        raise SqsError(
            "InvalidClientTokenId", "The security token included in the request is invalid."
        )
    if scope["service"] != "sqs":
        raise SqsError("SignatureDoesNotMatch", "The credential scope must name service sqs.")
    amz_date = (by_name.get("x-amz-date") or [""])[0]
    if not amz_date.startswith(scope["date"]):
        raise SqsError("SignatureDoesNotMatch", "X-Amz-Date does not match the credential.")
    signed = match["signed"].split(";")
    if "host" not in signed:
        raise SqsError("SignatureDoesNotMatch", "The Host header must be signed.")
    canonical_headers = "".join(
        f"{name}:{','.join(' '.join(v.split()) for v in by_name.get(name, []))}\n"
        for name in signed
    )
    canonical_request = "\n".join(
        [
            method,
            quote(path or "/", safe="/~"),
            _canonical_query(query_string),
            canonical_headers,
            match["signed"],
            hashlib.sha256(body).hexdigest(),
        ]
    )
    credential_scope = "/".join(
        [scope["date"], scope["region"], scope["service"], "aws4_request"]
    )
    string_to_sign = "\n".join(
        [
            ALGORITHM,
            amz_date,
            credential_scope,
            hashlib.sha256(canonical_request.encode("utf-8")).hexdigest(),
        ]
    )
    signing_key = _hmac(("AWS4" + secret).encode("utf-8"), scope["date"])
    for part in (scope["region"], scope["service"], "aws4_request"):
        signing_key = _hmac(signing_key, part)
    expected = hmac.new(signing_key, string_to_sign.encode("utf-8"), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, match["signature"]):
        raise SqsError(
            "SignatureDoesNotMatch",
            "The request signature we calculated does not match the signature you provided.",
        )
    return key
