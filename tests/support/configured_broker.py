"""A `danube broker` process configured by a YAML text, and reading one of its metrics."""

import urllib.request

from broker_process import BrokerProcess


def start_with_config(tmp_path, text, *flags):
    """A started broker whose only settings are `text` (YAML) and `flags`."""
    cfg = tmp_path / "broker.yml"
    cfg.write_text(text)
    b = BrokerProcess(data_dir=tmp_path / "d")
    b.args += ["--config-file", str(cfg), *flags]
    return b.start()


def metric(broker, name, **labels):
    """The value of metric `name` with `labels` (the broker needs --prom-exporter), or None
    if the broker does not export that series."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{broker.prom_port}/metrics",
                                  timeout=5).read().decode()
    for line in body.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None
