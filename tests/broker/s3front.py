"""A verifying front for moto's S3 server: moto does not check SigV4
signatures (only with IAM auth on, and then only in the Authorization
header, not presigned URLs), so this checks every request the way S3
does before passing it on, and refuses what S3 would refuse.

The signature is recomputed with botocore's own SigV4 signer (an
implementation independent of the daemon's: rusty-s3 for presigned
URLs, hatchery-audit's s3::sigv4 for the put), over what S3 signs: the
method; the path, decoded and URI-encoded again (S3's UriEncode, so a
key sent with a character left raw is still signed as S3 sees it); the
query without X-Amz-Signature, decoded and encoded again; the signed
headers; and the payload hash (`x-amz-content-sha256`, or UNSIGNED-PAYLOAD
for a presigned URL that does not sign one). A body whose SHA-256 is
not the `x-amz-content-sha256` it came with is refused too
(XAmzContentSHA256Mismatch), as are an unknown key, a credential scope
for another day, region or service, an expired presigned URL, a header-
signed request over 15 minutes off, and an unsigned one.

Run with the s3 venv's python (botocore is there):
  s3front.py LISTEN_PORT UPSTREAM_PORT KEYS_JSON REGION [CERT KEY]
KEYS_JSON maps access key ids to secrets. Each request's verdict goes to
stdout as a JSON line ({"method", "path", "auth", "payload", "verdict"})
for the tests to read; accepted requests are passed to moto on
127.0.0.1:UPSTREAM_PORT and its answer is relayed."""

import hashlib
import hmac
import http.client
import json
import ssl
import sys
import threading
import time
from calendar import timegm
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from botocore.auth import S3SigV4Auth, S3SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

ALGORITHM = "AWS4-HMAC-SHA256"
UNSIGNED = "UNSIGNED-PAYLOAD"
SKEW_S = 15 * 60
MAX_BODY = 64 << 20
HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-authorization"}


class Refused(Exception):
    def __init__(self, status, code, message):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def _stamp(s):
    try:
        return timegm(time.strptime(s, "%Y%m%dT%H%M%SZ"))
    except (TypeError, ValueError):
        raise Refused(403, "AccessDenied", f"X-Amz-Date {s!r} is not YYYYMMDDTHHMMSSZ")


def check(method, target, headers, body, keys, region, now=None):
    """Raises Refused unless the request is signed as S3 wants it;
    returns (auth kind, payload kind)."""
    now = time.time() if now is None else now
    parts = urlsplit(target)
    query = parse_qsl(parts.query, keep_blank_values=True)
    q = dict(query)
    h = {k.lower(): v for k, v in headers.items()}
    if "X-Amz-Signature" in q:
        kind = "query"
        if q.get("X-Amz-Algorithm") != ALGORITHM:
            raise Refused(400, "AuthorizationQueryParametersError", "X-Amz-Algorithm must be " + ALGORITHM)
        try:
            cred, signed, date, given = (q["X-Amz-Credential"], q["X-Amz-SignedHeaders"],
                                         q["X-Amz-Date"], q["X-Amz-Signature"])
            expires = int(q["X-Amz-Expires"])
        except (KeyError, ValueError):
            raise Refused(400, "AuthorizationQueryParametersError", "a presigned URL's parameters are missing")
        if not 1 <= expires <= 604800:
            raise Refused(400, "AuthorizationQueryParametersError", "X-Amz-Expires out of range")
        if now > _stamp(date) + expires:
            raise Refused(403, "AccessDenied", "Request has expired")
        params = [(k, v) for k, v in query if k != "X-Amz-Signature"]
        auth_cls = S3SigV4QueryAuth
    elif h.get("authorization", "").startswith(ALGORITHM + " "):
        kind = "header"
        fields = dict(f.strip().split("=", 1) for f in h["authorization"][len(ALGORITHM) + 1:].split(",") if "=" in f)
        try:
            cred, signed, given = fields["Credential"], fields["SignedHeaders"], fields["Signature"]
        except KeyError:
            raise Refused(400, "AuthorizationHeaderMalformed", "Credential, SignedHeaders and Signature are required")
        date = h.get("x-amz-date", "")
        if abs(now - _stamp(date)) > SKEW_S:
            raise Refused(403, "RequestTimeTooSkewed", "x-amz-date is over 15 minutes off")
        for must in ("x-amz-date", "x-amz-content-sha256"):
            if must not in signed.split(";"):
                raise Refused(400, "InvalidRequest", f"{must} must be present and signed")
        params = query
        auth_cls = S3SigV4Auth
    else:
        raise Refused(403, "AccessDenied", "Anonymous access is refused: sign the request")
    scope = cred.split("/")
    if len(scope) != 5:
        raise Refused(400, "AuthorizationHeaderMalformed", f"credential {cred!r}")
    key_id, day, cred_region, service, term = scope
    if key_id not in keys:
        raise Refused(403, "InvalidAccessKeyId", "The AWS Access Key Id you provided does not exist in our records.")
    if (day, cred_region, service, term) != (date[:8], region, "s3", "aws4_request"):
        raise Refused(400, "AuthorizationHeaderMalformed", f"credential scope {cred!r} (this store: {region}, s3)")
    names = signed.split(";")
    if "host" not in names or names != sorted(names):
        raise Refused(400, "AuthorizationHeaderMalformed", "SignedHeaders must be sorted and include host")
    missing = [n for n in names if n not in h]
    if missing:
        raise Refused(403, "AccessDenied", f"signed headers not sent: {missing}")
    payload = h.get("x-amz-content-sha256")
    if payload is not None and payload != UNSIGNED:
        if payload != hashlib.sha256(body).hexdigest():
            raise Refused(400, "XAmzContentSHA256Mismatch",
                          "The provided 'x-amz-content-sha256' header does not match what was computed.")
    # What S3 signs, recomputed by botocore: the path as S3 decodes and
    # encodes it, the decoded parameters (botocore encodes them), the
    # signed headers as sent; the payload hash is x-amz-content-sha256
    # when it is signed (botocore reads that header), else UNSIGNED-PAYLOAD.
    url = f"http://{h['host']}{quote(unquote(parts.path), safe='/~')}"
    req = AWSRequest(method=method, url=url, headers={n: h[n] for n in names}, params=params)
    req.context["timestamp"] = date
    auth = auth_cls(Credentials(key_id, keys[key_id]), "s3", region)
    canonical = auth.canonical_request(req)
    want = auth.signature(auth.string_to_sign(req, canonical), req)
    if not hmac.compare_digest(want, given):
        raise Refused(403, "SignatureDoesNotMatch",
                      "The request signature we calculated does not match the signature you provided.")
    signed_payload = "x-amz-content-sha256" in names and payload not in (None, UNSIGNED)
    return kind, "signed" if signed_payload else "unsigned"


def serve(listen, upstream, keys, region, cert=None, key=None):
    out = threading.Lock()

    def record(**kw):
        with out:
            sys.stdout.write(json.dumps(kw) + "\n")
            sys.stdout.flush()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def handle_one(self):
            n = int(self.headers.get("Content-Length") or 0)
            if n > MAX_BODY:
                return self.error(Refused(400, "EntityTooLarge", "over the front's cap"))
            body = self.rfile.read(n) if n else b""
            path = urlsplit(self.path).path
            try:
                kind, payload = check(self.command, self.path, dict(self.headers.items()), body, keys, region)
            except Refused as e:
                record(method=self.command, path=path, auth="-", payload="-", verdict=e.code)
                return self.error(e)
            record(method=self.command, path=path, auth=kind, payload=payload, verdict="ok")
            c = http.client.HTTPConnection("127.0.0.1", upstream, timeout=30)
            try:
                fwd = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
                c.request(self.command, self.path, body=body if n else None, headers=fwd)
                r = c.getresponse()
                data = r.read()
                self.send_response(r.status)
                for k, v in r.getheaders():
                    if k.lower() not in HOP and k.lower() != "content-length":
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
            finally:
                c.close()

        def error(self, e):
            xml = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{e.code}</Code>'
                   f"<Message>{e.message}</Message></Error>").encode()
            self.send_response(e.status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(xml)))
            self.end_headers()
            self.wfile.write(xml)

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = handle_one

    srv = ThreadingHTTPServer(("127.0.0.1", listen), Handler)
    if cert:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(cert, key)
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    srv.serve_forever()


if __name__ == "__main__":
    a = sys.argv[1:]
    serve(int(a[0]), int(a[1]), json.load(open(a[2])), a[3], *(a[4:6] if len(a) >= 6 else ()))
