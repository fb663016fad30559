"""A broker in `auth.mode: tls` for the security tests: its certificates (from the session's
trustme CA, tests/conftest.py `certs`), its YAML, tokens minted with its secret, and grpcio
calls over TLS with or without a token."""

import os
import textwrap

import grpc
import pytest

from broker_process import BrokerProcess
from danube.proto import DanubeAdmin_pb2 as adm
from danube.security.tokens import mint_token

SECRET = "test-secret-key-long-enough-for-hs256!"
SUPER = "admin"


def write_server_files(certs):
    """cert.pem and key.pem of the CA's 127.0.0.1/localhost certificate; returns their paths."""
    cert = os.path.join(certs.dir, "server.pem")
    key = os.path.join(certs.dir, "server.key")
    if not os.path.exists(key):
        certs.server_cert.private_key_pem.write_to_path(key)
        certs.server_cert.cert_chain_pems[0].write_to_path(cert)
    return cert, key


def broker_yaml(tmp_path, certs, jwt_extra="", extra="", secret=SECRET, cert_files=None,
                tls_extra=""):
    cert, key = cert_files or write_server_files(certs)
    lines = ["broker: {host: 127.0.0.1, ports: {client: 0, admin: 0}}",
             "admin_tls: true",
             "auth:",
             "  mode: tls",
             f'  tls: {{cert_file: "{cert}", key_file: "{key}", ca_file: "{certs.ca_file}"'
             f'{tls_extra}}}',
             f'  super_admins: ["{SUPER}"]',
             "  jwt:",
             "    issuer: danube-auth",
             "    expiration_time: 3600"]
    if secret:
        lines.append(f'    secret_key: "{secret}"')
    lines += ["    " + line for line in textwrap.dedent(jwt_extra).splitlines() if line]
    text = "\n".join(lines) + "\n" + textwrap.dedent(extra)
    path = tmp_path / "secure.yml"
    path.write_text(text)
    return str(path)


def start_secure(tmp_path, certs, *args, **yaml_kwargs):
    path = broker_yaml(tmp_path, certs, **yaml_kwargs)
    return BrokerProcess("--config-file", path, *args, data_dir=tmp_path / "data").start()


def token(subject, ttl=3600, principal_type="service_account", **kwargs):
    return mint_token(subject, secret_key=kwargs.pop("secret_key", SECRET), ttl=ttl,
                      principal_type=principal_type, **kwargs)


class Caller:
    """grpcio over TLS to one port; `call` returns the response or raises grpc.RpcError."""

    def __init__(self, addr, certs):
        self.certs = certs
        creds = grpc.ssl_channel_credentials(root_certificates=certs.ca_pem)
        self.channel = grpc.secure_channel(addr, creds)

    def call(self, path, request, response_cls, token=None, raw_header=None, timeout=10):
        fn = self.channel.unary_unary(path, request_serializer=lambda m: m.SerializeToString(),
                                      response_deserializer=response_cls.FromString)
        metadata = []
        if token is not None:
            metadata.append(("authorization", f"Bearer {token}"))
        if raw_header is not None:
            metadata.append(("authorization", raw_header))
        return fn(request, metadata=metadata, timeout=timeout)

    def code(self, *args, **kwargs):
        """(status code, details) of a call; OK with the response as details."""
        try:
            return grpc.StatusCode.OK, self.call(*args, **kwargs)
        except grpc.RpcError as exc:
            return exc.code(), exc.details()

    def stream(self, path, request, response_cls, token=None, timeout=30):
        fn = self.channel.unary_stream(path,
                                       request_serializer=lambda m: m.SerializeToString(),
                                       response_deserializer=response_cls.FromString)
        metadata = [("authorization", f"Bearer {token}")] if token else []
        return fn(request, metadata=metadata, timeout=timeout)

    def close(self):
        self.channel.close()


class Security:
    """SecurityAdmin calls as the super admin."""

    def __init__(self, admin: Caller, as_token=None):
        self.admin = admin
        self.token = as_token or token(SUPER)

    def _call(self, method, request, response_cls):
        return self.admin.call(f"/danube_admin.SecurityAdmin/{method}", request, response_cls,
                               token=self.token)

    def role(self, name, *permissions):
        self._call("CreateRole", adm.CreateRoleRequest(role=adm.RoleDefinition(
            name=name, permissions=list(permissions))), adm.CreateRoleResponse)

    def delete_role(self, name):
        self._call("DeleteRole", adm.DeleteRoleRequest(name=name), adm.DeleteRoleResponse)

    def bind(self, binding_id, subject, roles, scope="cluster", resource="",
             principal_type="service_account"):
        self._call("CreateBinding", adm.CreateBindingRequest(binding=adm.BindingDefinition(
            id=binding_id, principal_type=principal_type, principal_name=subject,
            role_names=list(roles), scope=scope, resource_name=resource)),
            adm.CreateBindingResponse)

    def unbind(self, binding_id, scope="cluster", resource=""):
        self._call("DeleteBinding", adm.DeleteBindingRequest(
            scope=scope, resource_name=resource, binding_id=binding_id),
            adm.DeleteBindingResponse)


# Module-scoped Callers to a module's `broker` fixture; test modules import them by name.
@pytest.fixture(scope="module")
def client(broker, certs):
    c = Caller(broker.client_addr, certs)
    yield c
    c.close()


@pytest.fixture(scope="module")
def admin(broker, certs):
    c = Caller(broker.admin_addr, certs)
    yield c
    c.close()


def broker_fixture(label, *args, **yaml_kwargs):
    """A module-scoped fixture: a secure broker (start_secure's arguments) for the module's
    tests, stopped cleanly at the end. `broker = broker_fixture("auth")` in a test module."""
    @pytest.fixture(scope="module")
    def fixture(tmp_path_factory, certs):
        b = start_secure(tmp_path_factory.mktemp(label), certs, *args, **yaml_kwargs)
        yield b
        assert b.stop() == 0
    return fixture
