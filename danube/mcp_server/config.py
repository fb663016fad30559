"""upstream's MCP config file (--config, DANUBE_MCP_CONFIG; danube-admin/mcp-config.yml):
broker_endpoint, prometheus_url and the deployment whose logs the log tools read (docker,
kubernetes or local files). Checked whole at start: a bad file is refused with the reason."""

import os

import yaml

DEFAULT_PROMETHEUS = "http://localhost:9090"
TYPES = ("docker", "kubernetes", "local")


class ConfigError(ValueError):
    pass


class McpConfig:
    def __init__(self, broker_endpoint, prometheus_url=DEFAULT_PROMETHEUS, deployment=None):
        self.broker_endpoint = broker_endpoint
        self.prometheus_url = prometheus_url
        self.deployment = deployment        # the checked `deployment` mapping, or None

    @classmethod
    def minimal(cls, broker_endpoint):
        return cls(broker_endpoint)

    @classmethod
    def from_file(cls, path):
        try:
            with open(path, encoding="utf-8") as f:
                doc = yaml.safe_load(f)
        except OSError as exc:
            raise ConfigError(f"Failed to read config file {path}: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"Failed to parse config file {path}: {exc}") from None
        if not isinstance(doc, dict):
            raise ConfigError(f"config file {path}: expected a mapping at the top")
        endpoint = doc.get("broker_endpoint")
        if not isinstance(endpoint, str) or not endpoint:
            raise ConfigError(f"config file {path}: missing field `broker_endpoint`")
        prom = doc.get("prometheus_url", DEFAULT_PROMETHEUS)
        if not isinstance(prom, str):
            raise ConfigError(f"config file {path}: prometheus_url must be a string")
        deployment = doc.get("deployment")
        if deployment is not None:
            _check_deployment(deployment, path)
        return cls(endpoint, prom, deployment)

    def has_log_access(self):
        return self.deployment is not None


def _check_deployment(d, path):
    where = f"config file {path}: deployment"
    if not isinstance(d, dict) or d.get("type") not in TYPES:
        raise ConfigError(f"{where}.type must be one of {', '.join(TYPES)}")
    kind = d["type"]
    section = d.get(kind)
    if not isinstance(section, dict):
        raise ConfigError(f"{where}: {kind.capitalize()} deployment type requires "
                          f"'{kind}' configuration")
    if kind == "docker":
        if not _mappings(section.get("brokers"), ("id", "container")):
            raise ConfigError(f"{where}: Docker configuration requires at least one broker "
                              "mapping (id, container)")
        if section.get("other") is not None and \
                not _mappings(section["other"], ("id", "container")):
            raise ConfigError(f"{where}.docker.other: a list of (id, container)")
    elif kind == "kubernetes":
        if not isinstance(section.get("namespace"), str):
            raise ConfigError(f"{where}.kubernetes.namespace is required")
        if not (section.get("broker_service") or section.get("broker_selector")):
            raise ConfigError(f"{where}: Kubernetes configuration requires either "
                              "'broker_service' or 'broker_selector'")
    else:
        log_dir = section.get("log_dir")
        if not isinstance(log_dir, str) or not os.path.isdir(log_dir):
            raise ConfigError(f"{where}: Local log directory does not exist: {log_dir!r}")
        if not _mappings(section.get("brokers"), ("id", "log_file")):
            raise ConfigError(f"{where}.local.brokers: a list of (id, log_file)")


def _mappings(items, keys):
    return isinstance(items, list) and bool(items) and all(
        isinstance(i, dict) and all(isinstance(i.get(k), str) for k in keys) for i in items)
