"""Log tools (upstream's tools/logs.rs): a broker's log by the deployment of the config file
(docker, kubernetes or local files), and docker/kubectl directly. Commands run with a
timeout and their output is cut to the last MAX_LINES lines."""

import asyncio
import os
from typing import Annotated

from pydantic import Field

from danube.mcp_server.context import text_tool

MAX_LINES = 10000
TIMEOUT = 30.0
LINES = Field(ge=0, le=2 ** 32 - 1, description=(
    f"Lines from the end of the log (at most {MAX_LINES}). Default: 500"))
NO_CONFIG = ("Error: No deployment configuration provided. Log fetching is not available.\n"
             "Hint: Start danube-admin with --config to enable log access.")


async def run(argv, what):
    """(ok, text) of a command: stdout and stderr, or why it could not run."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            stdin=asyncio.subprocess.DEVNULL)
    except OSError as exc:
        return False, f"Failed to execute {argv[0]} command: {exc.strerror or exc}\n{what}"
    try:
        out, err = await asyncio.wait_for(proc.communicate(), TIMEOUT)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        return False, f"{argv[0]} did not finish within {TIMEOUT:.0f} s"
    return proc.returncode == 0, (out.decode("utf-8", "replace"),
                                  err.decode("utf-8", "replace"))


async def docker_logs(container, lines):
    lines = min(lines, MAX_LINES)
    ok, res = await run(["docker", "logs", "--tail", str(lines), container],
                        "Is Docker installed and running?")
    if isinstance(res, str):
        return res
    return res[0] + res[1] if ok else \
        f"Error fetching logs from container '{container}': {res[1]}"


async def k8s_logs(namespace, pod, lines):
    lines = min(lines, MAX_LINES)
    ok, res = await run(["kubectl", "logs", "-n", namespace, pod, f"--tail={lines}"],
                        "Is kubectl installed and configured?")
    if isinstance(res, str):
        return res
    return res[0] if ok else f"Error fetching logs from pod '{namespace}/{pod}': {res[1]}"


def tail_file(path, lines):
    lines = min(lines, MAX_LINES)
    if lines == 0:
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024 * 1024))     # the last 64 MiB at most
            text = f.read().decode("utf-8", "replace")
    except OSError as exc:
        return f"Error reading log file {path!r}: {exc.strerror or exc}"
    return "\n".join(text.splitlines()[-lines:])


def register(mcp, ctx):
    config = ctx.config

    @text_tool(mcp)
    async def get_broker_logs(
            broker_id: Annotated[str, Field(description=(
                "A broker ID of the config file's deployment; list_configured_brokers shows "
                "them."))],
            lines: Annotated[int, LINES] = 500) -> str:
        """Get the last lines of a broker's log, as the config file's deployment says
        (docker, kubernetes or local files). Needs --config."""
        d = config.deployment if config is not None else None
        if d is None:
            return NO_CONFIG
        kind, section = d["type"], d[d["type"]]
        if kind == "docker":
            found = next((m for m in section["brokers"] + (section.get("other") or [])
                          if m["id"] == broker_id), None)
            if found is None:
                return (f"Error: Broker '{broker_id}' not found in configuration.\n"
                        f"Available brokers: {[m['id'] for m in section['brokers']]}")
            return await docker_logs(found["container"], lines)
        if kind == "local":
            found = next((m for m in section["brokers"] if m["id"] == broker_id), None)
            if found is None:
                return (f"Error: Broker '{broker_id}' not found in configuration.\n"
                        f"Available brokers: {[m['id'] for m in section['brokers']]}")
            return tail_file(os.path.join(section["log_dir"], found["log_file"]), lines)
        selector = f"app={section['broker_service']}" if section.get("broker_service") \
            else section["broker_selector"]
        ok, res = await run(["kubectl", "get", "pods", "-n", section["namespace"], "-l",
                             selector, "-o", "jsonpath={.items[*].metadata.name}"], "")
        if isinstance(res, str) or not ok:
            return f"Error finding pods: {res if isinstance(res, str) else res[1]}"
        pods = res[0].split()
        pod = next((p for p in pods if broker_id in p), None)
        if pod is None:
            return (f"Error: No pod found matching broker_id '{broker_id}'\n"
                    f"Available pods: {pods}")
        return await k8s_logs(section["namespace"], pod, lines)

    @text_tool(mcp)
    async def list_configured_brokers() -> str:
        """List the brokers of the config file's deployment (for get_broker_logs)."""
        d = config.deployment if config is not None else None
        if d is None:
            return "No deployment configuration provided. Log fetching is not available."
        kind, section = d["type"], d[d["type"]]
        if kind == "docker":
            out = "Configured Docker containers:\n\nBrokers:\n" + "".join(
                f"  - {m['id']} → container: {m['container']}\n" for m in section["brokers"])
            if section.get("other"):
                out += "\nOther services:\n" + "".join(
                    f"  - {m['id']} → container: {m['container']}\n" for m in section["other"])
            return out
        if kind == "kubernetes":
            return (f"Kubernetes deployment:\nNamespace: {section['namespace']}\n"
                    f"Service: {section.get('broker_service') or 'not set'}\n"
                    f"Selector: {section.get('broker_selector') or 'not set'}\n\n"
                    "Use list_k8s_pods to see running pods.")
        return f"Local log files in: {section['log_dir']!r}\n\n" + "".join(
            f"  - {m['id']} → {m['log_file']}\n" for m in section["brokers"])

    @text_tool(mcp)
    async def list_docker_containers() -> str:
        """List the running Docker containers (docker ps)."""
        ok, res = await run(["docker", "ps", "--format",
                             "table {{.Names}}\t{{.Status}}\t{{.Ports}}"], "")
        if isinstance(res, str):
            return res
        return res[0] if ok else f"Error listing containers: {res[1]}"

    @text_tool(mcp)
    async def list_k8s_pods(namespace: Annotated[str, Field(description=(
            "Kubernetes namespace. Example: \"danube-system\""))]) -> str:
        """List the pods of a Kubernetes namespace (kubectl get pods)."""
        ok, res = await run(["kubectl", "get", "pods", "-n", namespace, "-o", "wide"], "")
        if isinstance(res, str):
            return res
        return res[0] if ok else f"Error listing pods: {res[1]}"

    @text_tool(mcp)
    async def fetch_container_logs(
            container_name: Annotated[str, Field(description="Docker container name or ID.")],
            lines: Annotated[int, LINES] = 500) -> str:
        """Get the last lines of any Docker container's log."""
        return await docker_logs(container_name, lines)

    @text_tool(mcp)
    async def fetch_pod_logs(
            namespace: Annotated[str, Field(description="Kubernetes namespace.")],
            pod_name: Annotated[str, Field(description="Pod name.")],
            lines: Annotated[int, LINES] = 500) -> str:
        """Get the last lines of any Kubernetes pod's log."""
        return await k8s_logs(namespace, pod_name, lines)
