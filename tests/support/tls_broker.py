"""A broker process serving TLS on both ports (`admin_tls: true`, `auth.mode: tls`) with
certificates made for the test by trustme; `ca_file` is what clients trust."""

from broker_process import BrokerProcess


def start_tls_broker(d, *extra_args):
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert.private_key_pem.write_to_path(str(d / "key.pem"))
    cert.cert_chain_pems[0].write_to_path(str(d / "cert.pem"))
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    config = d / "secure.yml"
    config.write_text(f"""
broker: {{host: 127.0.0.1, ports: {{client: 0, admin: 0}}}}
meta_store: {{data_dir: "{d}/meta"}}
admin_tls: true
auth:
  mode: tls
  tls: {{cert_file: "{d}/cert.pem", key_file: "{d}/key.pem", ca_file: "{d}/ca.pem"}}
""")
    b = BrokerProcess(data_dir=d / "data")
    b.args = ["--mode", "standalone", "--data-dir", str(d / "data"), "--config-file",
              str(config), "--insecure-allow-unauthenticated", *extra_args]
    b.start()
    b.ca_file = str(d / "ca.pem")
    return b
