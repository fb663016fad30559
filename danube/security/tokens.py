"""JWT authentication (reference b.8): who a call comes from, read from its
`authorization: Bearer <JWT>` header, and tokens minted offline for `danube admin security
tokens create`.

Upstream validates HS256 with `auth.jwt.secret_key` through jsonwebtoken's default
validation. Ours does the same and, as additions, RS256/ES256 with a public key
(`auth.jwt.public_key_file`), `iss` when `auth.jwt.issuer` is set, `nbf` when present and a
configurable leeway (`auth.jwt.leeway_seconds`, default 60 s, jsonwebtoken's). The accepted
algorithm list is pinned per configured key, so `alg: none` and algorithm confusion (an RS256
public key used as an HMAC secret) cannot pass.
"""

import collections
import dataclasses
import functools
import time
import warnings

PRINCIPAL_TYPES = ("service_account", "user", "broker_internal")
DEFAULT_PRINCIPAL_TYPE = "service_account"
DEFAULT_ISSUER = "danube-auth"
DEFAULT_LEEWAY = 60.0
# As upstream: a validated token is trusted this long before it is checked again.
CACHE_TTL = 30.0
CACHE_SIZE = 4096
# A refused token is remembered this long (in an LRU a quarter the size), so a client
# retrying with the same bad token costs a lookup, not a signature check, each time.
REFUSED_TTL = 5.0
# Far above any real token (a few hundred bytes), far below the header-list limit: a larger
# value is refused before any decoding work.
MAX_TOKEN_BYTES = 8192
MISSING = "Authentication credentials are missing"


class TokenError(Exception):
    """A token refused; str() is the UNAUTHENTICATED message."""


class KeyConfigError(ValueError):
    """An unusable auth.jwt key setting; str() names it."""


@dataclasses.dataclass(frozen=True, slots=True)
class Principal:
    type: str
    name: str
    expires_at: float | None = None      # the token's exp (unix seconds)

    def __str__(self):
        return f"{self.type}:{self.name}"


def load_public_key(path):
    """(key, algorithms) from a PEM public key or certificate: RSA keys verify RS256 only,
    P-256 keys ES256 only."""
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    from cryptography.hazmat.primitives.serialization import load_pem_public_key
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise KeyConfigError(f"auth.jwt.public_key_file: cannot read {path}: "
                             f"{exc.strerror or exc}") from None
    try:
        if b"BEGIN CERTIFICATE" in data:
            key = x509.load_pem_x509_certificate(data).public_key()
        else:
            key = load_pem_public_key(data)
    except ValueError as exc:
        raise KeyConfigError(f"auth.jwt.public_key_file: {path} is not a PEM public key or "
                             f"certificate ({exc})") from None
    if isinstance(key, rsa.RSAPublicKey):
        return key, ("RS256",)
    if isinstance(key, ec.EllipticCurvePublicKey) and isinstance(key.curve, ec.SECP256R1):
        return key, ("ES256",)
    raise KeyConfigError(f"auth.jwt.public_key_file: {path} holds a key of a kind not "
                         f"accepted (an RSA key for RS256 or a P-256 key for ES256)")


@functools.cache
def _jwt():
    """pyjwt, imported on first use: it and cryptography take ~130 ms to import, which a
    broker without authentication (and every CLI start) should not pay. Cached, so the
    warning filter is installed once, not on every token verified."""
    import jwt
    from jwt.warnings import InsecureKeyLengthWarning

    # Upstream's own example secret is 15 bytes: short HMAC keys must work. The broker says
    # so once at start (weak_secret_warning) rather than pyjwt once per calling line.
    warnings.filterwarnings("ignore", category=InsecureKeyLengthWarning)
    return jwt


def _seconds(value, what, default):
    if value is None:
        return default
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise KeyConfigError(f"{what}: expected a number of seconds, got {value!r}") from None
    if seconds < 0:
        raise KeyConfigError(f"{what}: must not be negative, got {value!r}")
    return seconds


class TokenVerifier:
    """Validates bearer tokens; validated ones are cached (bounded LRU) for CACHE_TTL, never
    past their expiry."""

    def __init__(self, *, secret_key=None, public_key=None, public_algorithms=(),
                 issuer=None, leeway=DEFAULT_LEEWAY, clock=time.time,
                 cache_ttl=CACHE_TTL, cache_size=CACHE_SIZE):
        self.keys = {}
        if secret_key:
            self.keys["HS256"] = secret_key.encode() if isinstance(secret_key, str) \
                else secret_key
        for alg in public_algorithms:
            self.keys[alg] = public_key
        if not self.keys:
            raise KeyConfigError("no JWT key configured: set auth.jwt.secret_key or "
                                 "auth.jwt.public_key_file")
        self.issuer = issuer or None
        self.leeway = leeway
        self.clock = clock
        self.cache_ttl = cache_ttl
        self.cache_size = cache_size
        self._cache = collections.OrderedDict()
        self._refused = collections.OrderedDict()      # header value -> (why, until)
        required = ["exp", "sub"] + (["iss"] if self.issuer else [])
        self._options = {"require": required, "verify_aud": False}

    @classmethod
    def from_config(cls, jwt_cfg, **kwargs):
        jwt_cfg = jwt_cfg or {}
        public_key, algorithms = None, ()
        path = jwt_cfg.get("public_key_file")
        if path:
            public_key, algorithms = load_public_key(str(path))
        secret = jwt_cfg.get("secret_key")
        if secret is not None and not isinstance(secret, str):
            raise KeyConfigError("auth.jwt.secret_key: expected a string")
        leeway = _seconds(jwt_cfg.get("leeway_seconds"), "auth.jwt.leeway_seconds",
                          DEFAULT_LEEWAY)
        return cls(secret_key=secret, public_key=public_key, public_algorithms=algorithms,
                   issuer=jwt_cfg.get("issuer"), leeway=leeway, **kwargs)

    @property
    def algorithms(self):
        return tuple(self.keys)

    def verify_header(self, value):
        """The Principal of an `authorization` header value (bytes or str); TokenError
        (with the reason) when it cannot be trusted."""
        hit = self._cache.get(value)
        if hit is not None:
            principal, valid_until = hit
            if self.clock() < valid_until:
                self._cache.move_to_end(value)
                return principal
            del self._cache[value]
        refused = self._refused.get(value)
        if refused is not None:
            if self.clock() < refused[1]:
                raise TokenError(refused[0])
            del self._refused[value]
        try:
            principal = self._verify_header(value)
        except TokenError as exc:
            if len(value) <= MAX_TOKEN_BYTES + 7:
                self._refused[value] = (str(exc), self.clock() + REFUSED_TTL)
                if len(self._refused) > self.cache_size // 4:
                    self._refused.popitem(last=False)
            raise
        now = self.clock()
        valid_until = now + self.cache_ttl
        if principal.expires_at is not None:
            valid_until = min(valid_until, principal.expires_at + self.leeway)
        self._cache[value] = (principal, valid_until)
        if len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return principal

    def _verify_header(self, value):
        if len(value) > MAX_TOKEN_BYTES + 7:
            raise TokenError(f"Invalid token: longer than {MAX_TOKEN_BYTES} bytes")
        if isinstance(value, bytes):
            try:
                value_text = value.decode("ascii")
            except UnicodeDecodeError:
                raise TokenError("Authentication metadata is invalid: the authorization "
                                 "header is not ASCII") from None
        else:
            value_text = value
        if value_text.startswith(("Bearer ", "bearer ")):
            token = value_text[7:].strip()
        else:
            raise TokenError("Invalid token: the authorization header must be "
                             "'Bearer <token>'")
        return self.verify(token)

    def verify(self, token):
        """The Principal of a bare JWT; TokenError naming why it is refused."""
        if not token:
            raise TokenError("Invalid token: empty")
        jwt = _jwt()
        jx = jwt.exceptions
        try:
            header = jwt.get_unverified_header(token)
        except jx.InvalidTokenError as exc:
            raise TokenError(f"Invalid token: malformed ({exc})") from None
        alg = header.get("alg")
        key = self.keys.get(alg) if isinstance(alg, str) else None
        if key is None:
            raise TokenError(f"Invalid token: algorithm {alg!r} is not accepted (accepted: "
                             f"{', '.join(self.keys)})")
        try:
            claims = jwt.decode(token, key, algorithms=[alg], issuer=self.issuer,
                                leeway=self.leeway, options=self._options)
        except jx.ExpiredSignatureError:
            raise TokenError("Invalid token: expired") from None
        except jx.ImmatureSignatureError:
            raise TokenError("Invalid token: not yet valid (nbf is in the future)") from None
        except jx.InvalidIssuerError:
            raise TokenError(f"Invalid token: issuer is not {self.issuer!r}") from None
        except jx.MissingRequiredClaimError as exc:
            raise TokenError(f"Invalid token: the {exc.claim!r} claim is missing") from None
        except jx.InvalidSignatureError:
            raise TokenError("Invalid token: the signature does not verify") from None
        except jx.InvalidTokenError as exc:
            raise TokenError(f"Invalid token: {exc}") from None
        except (ValueError, TypeError) as exc:
            # The key library's own complaints about a crafted signature or key.
            raise TokenError(f"Invalid token: {exc}") from None
        return principal_from_claims(claims)


def weak_secret_warning(jwt_cfg):
    """A warning line when auth.jwt.secret_key is shorter than RFC 7518's minimum for
    HS256, else None."""
    secret = (jwt_cfg or {}).get("secret_key")
    if isinstance(secret, str) and secret and len(secret.encode()) < 32:
        return (f"auth.jwt.secret_key is {len(secret.encode())} bytes, below the 32 bytes "
                f"RFC 7518 recommends for HS256: anyone who guesses it can mint tokens")
    return None


def principal_from_claims(claims):
    sub = claims.get("sub")
    name = claims.get("principal_name") or sub
    if not isinstance(name, str) or not name:
        raise TokenError("Invalid token: the principal_name (or sub) claim must be a "
                         "non-empty string")
    ptype = claims.get("principal_type")
    if ptype not in PRINCIPAL_TYPES:
        ptype = DEFAULT_PRINCIPAL_TYPE      # upstream: anything else is a service account
    exp = claims.get("exp")
    return Principal(ptype, name, float(exp) if isinstance(exp, (int, float)) else None)


def parse_ttl(text):
    """Seconds from upstream's TTL syntax: `8760h`, `365d`, or plain seconds."""
    text = str(text).strip()
    units = {"h": 3600, "d": 86400, "m": 60, "s": 1}
    number, scale = (text[:-1], units[text[-1]]) if text and text[-1] in units else (text, 1)
    try:
        value = int(number)
    except ValueError:
        raise ValueError(f"invalid TTL {text!r}: use a number with h (hours) or d (days), "
                         f"e.g. 8760h or 365d") from None
    if value <= 0:
        raise ValueError(f"invalid TTL {text!r}: must be positive")
    return value * scale


def mint_token(subject, *, secret_key=None, private_key_pem=None, ttl=8760 * 3600,
               principal_type=DEFAULT_PRINCIPAL_TYPE, issuer=DEFAULT_ISSUER, now=None):
    """A signed token with upstream's claims (iss, exp, sub, principal_type, principal_name):
    HS256 with a secret, or RS256/ES256 with a PEM private key (ours)."""
    now = int(time.time() if now is None else now)
    claims = {"iss": issuer, "exp": now + int(ttl), "sub": subject,
              "principal_type": principal_type, "principal_name": subject}
    if private_key_pem is not None:
        from cryptography.hazmat.primitives.asymmetric import ec, rsa
        from cryptography.hazmat.primitives.serialization import load_pem_private_key
        try:
            key = load_pem_private_key(private_key_pem, password=None)
        except (ValueError, TypeError) as exc:
            raise KeyConfigError(f"not an unencrypted PEM private key ({exc})") from None
        if isinstance(key, rsa.RSAPrivateKey):
            alg = "RS256"
        elif isinstance(key, ec.EllipticCurvePrivateKey) and isinstance(key.curve,
                                                                         ec.SECP256R1):
            alg = "ES256"
        else:
            raise KeyConfigError("the private key must be RSA (RS256) or P-256 (ES256)")
        return _jwt().encode(claims, key, algorithm=alg)
    if not secret_key:
        raise KeyConfigError("a secret key (or a private key file) is required")
    return _jwt().encode(claims, secret_key, algorithm="HS256")
