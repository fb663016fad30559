"""The server side of TLS for both ports: one SSLContext from `auth.tls`, optionally requiring
client certificates signed by `auth.tls.ca_file` (mTLS, ours: `auth.tls.require_client_cert`),
and reloaded in place on SIGHUP.

A reload loads the files into a scratch context first, so a bad or half-written file leaves
the serving certificate untouched; only then into the live context, which new handshakes use
at once while established connections carry on with theirs.

A failed handshake (plaintext, a foreign or missing client certificate) only ends that
connection; it is logged as a warning at most once a minute, with how many more there were,
so that nobody can fill the log by connecting."""

import logging
import ssl
import time

log = logging.getLogger("danube.security")

LOG_EVERY = 60.0


class _HandshakeLog:
    last = None
    held = 0

    @classmethod
    def note(cls, exc):
        now = time.monotonic()
        if cls.last is not None and now - cls.last < LOG_EVERY:
            cls.held += 1
            return
        more = f" ({cls.held} more since the last report)" if cls.held else ""
        cls.last, cls.held = now, 0
        log.warning("TLS handshake failed: %s%s", getattr(exc, "reason", None) or exc, more)


class _ObservedSSLObject(ssl.SSLObject):
    """The event loop's SSL object (wrap_bio), reporting handshakes that fail."""

    def do_handshake(self):
        try:
            return super().do_handshake()
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
            raise
        except ssl.SSLError as exc:
            _HandshakeLog.note(exc)
            raise


class ServerTls:
    def __init__(self, cert_file, key_file, ca_file=None, require_client_cert=False):
        self.cert_file = cert_file
        self.key_file = key_file
        self.ca_file = ca_file
        self.require_client_cert = require_client_cert
        self.context = self._build()

    @classmethod
    def from_config(cls, cfg):
        return cls(cfg.tls_cert_file, cfg.tls_key_file, cfg.tls_ca_file,
                   cfg.tls_require_client_cert)

    def _build(self):
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.sslobject_class = _ObservedSSLObject
        self._load(ctx)
        ctx.set_alpn_protocols(["h2"])
        if self.require_client_cert:
            ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx

    def _load(self, ctx):
        ctx.load_cert_chain(self.cert_file, self.key_file)
        if self.ca_file:
            ctx.load_verify_locations(self.ca_file)

    def reload(self):
        """Load the files again (SIGHUP); returns whether the new ones are served. CAs are
        added to the trusted set: one removed from the file stays trusted until a restart."""
        try:
            self._load(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER))
            self._load(self.context)
        except (OSError, ssl.SSLError) as exc:
            log.error("TLS reload failed, still serving the previous certificate: %s", exc)
            return False
        log.info("TLS certificate reloaded from %s", self.cert_file)
        return True
