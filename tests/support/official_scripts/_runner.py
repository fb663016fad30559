"""Runs one official-client scenario (see tests/support/official_client.py). Run ONLY as

    <official python> -I _runner.py <scenario.py> <json args> <timeout seconds>

The scenario defines `async def main(args)`; its JSON result is printed as the last stdout
line. Exits through os._exit so that lingering gRPC channels or health-check tasks of the
client cannot delay or hang the exit.
"""

import asyncio
import json
import os
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def main():
    scenario_path, args, timeout = sys.argv[1], json.loads(sys.argv[2]), float(sys.argv[3])
    # Only the helpers directory is added: it holds no `danube` package.
    sys.path.insert(0, HERE)
    import danube  # the official client

    where = os.path.abspath(danube.__file__)
    if where.startswith(os.path.join(REPO, "danube") + os.sep):
        raise SystemExit(f"imported our own danube package ({where}), not danube-client")
    namespace = {"__name__": "scenario", "__file__": scenario_path}
    with open(scenario_path, encoding="utf-8") as f:
        exec(compile(f.read(), scenario_path, "exec"), namespace)
    result = asyncio.run(asyncio.wait_for(namespace["main"](args), timeout))
    return result


if __name__ == "__main__":
    try:
        out = main()
        sys.stdout.write("\n" + json.dumps(out) + "\n")
        code = 0
    except BaseException:  # noqa: BLE001 - report everything, including timeouts
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
