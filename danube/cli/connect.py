"""TLS and token options shared by `danube produce`, `consume` and `schema`.

Upstream's danube-cli connects in plain text only; ours reaches a broker in `auth.mode: tls`
too. Flags win over environment variables, which mirror danube-admin's DANUBE_ADMIN_* names
without the ADMIN_ (so one shell can hold both a client and an admin identity). A token is
better given by file or variable than by flag, which other users can read in `ps`.
"""

from __future__ import annotations

import os

ENV_HELP = ("environment: DANUBE_TOKEN, DANUBE_TOKEN_FILE, DANUBE_TLS=true, DANUBE_CA, "
            "DANUBE_CERT, DANUBE_KEY, DANUBE_DOMAIN (flags win)")


class ConnectError(Exception):
    """A connection option that cannot work: names the option and the problem."""


def add_connection_options(parser):
    group = parser.add_argument_group("security (ours)", ENV_HELP)
    group.add_argument("--tls", action="store_true", default=None,
                       help="connect with TLS (implied by an https:// address or --ca-file)")
    group.add_argument("--ca-file", metavar="PEM",
                       help="CA certificate to verify the broker with (default: system CAs)")
    group.add_argument("--cert-file", metavar="PEM",
                       help="client certificate for mTLS (with --key-file)")
    group.add_argument("--key-file", metavar="PEM", help="client private key for mTLS")
    group.add_argument("--tls-domain", metavar="NAME",
                       help="name the broker's certificate must carry (default: the host)")
    token = group.add_mutually_exclusive_group()
    token.add_argument("--token", metavar="JWT", help="JWT sent as 'authorization: Bearer'")
    token.add_argument("--token-file", metavar="PATH", help="read the JWT from this file")


def client_options(args, service_addr):
    """keyword arguments for DanubeClient (ssl, token, server_hostname) from the flags and
    the environment; raises ConnectError naming a missing file or a half-given mTLS pair."""
    env = os.environ
    ca = args.ca_file or env.get("DANUBE_CA") or None
    cert = args.cert_file or env.get("DANUBE_CERT") or None
    key = args.key_file or env.get("DANUBE_KEY") or None
    domain = args.tls_domain or env.get("DANUBE_DOMAIN") or None
    tls = bool(args.tls or env.get("DANUBE_TLS", "").lower() == "true"
               or service_addr.startswith("https://") or ca or cert)
    if service_addr.startswith("http://") and tls:
        raise ConnectError(f"{service_addr} is a plain-text address but TLS was asked for "
                           "(--tls, --ca-file, --cert-file or DANUBE_TLS): use https://")
    if bool(cert) != bool(key):
        raise ConnectError("mTLS needs both --cert-file and --key-file "
                           "(or DANUBE_CERT and DANUBE_KEY)")
    for flag, path in (("--ca-file", ca), ("--cert-file", cert), ("--key-file", key)):
        if path and not os.path.isfile(path):
            raise ConnectError(f"{flag}: no such file: {path}")
    options = {"token": _token(args, env)}
    if tls:
        from danube.rpc.client import client_ssl_context
        import ssl as _ssl
        try:
            options["ssl"] = client_ssl_context(ca_file=ca, cert_file=cert, key_file=key)
        except _ssl.SSLError as exc:
            raise ConnectError(f"cannot load the TLS files: {exc.reason or exc}") from None
        options["server_hostname"] = domain
    return options


def _token(args, env):
    path = args.token_file or (None if args.token else env.get("DANUBE_TOKEN_FILE"))
    if path:
        try:
            with open(path, encoding="utf-8") as fh:
                text = fh.read().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConnectError(f"--token-file: cannot read {path}: "
                               f"{getattr(exc, 'strerror', None) or exc}") from None
        if not text:
            raise ConnectError(f"--token-file: {path} is empty")
    else:
        text = (args.token or env.get("DANUBE_TOKEN") or "").strip()
    if any(ch.isspace() or not ch.isprintable() for ch in text):
        raise ConnectError("the token holds whitespace or control characters: give the JWT "
                           "alone")
    return text or None


def make_client(args):
    """A DanubeClient for `args.service_addr` with the security options applied."""
    from danube.client import DanubeClient

    return DanubeClient(args.service_addr, **client_options(args, args.service_addr))
