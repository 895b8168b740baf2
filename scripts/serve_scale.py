"""Deploy, or resize, the Serve application of a config file on a running Ray cluster, and wait until it runs.

    python scripts/serve_scale.py CONFIG.yaml REPLICAS [--timeout 420]

It deploys the way `serve deploy` does (a config, not code), so a later call that changes only `num_replicas`
is a lightweight update: the replicas that stay keep running, warm, and only the others stop. The scale
bench (`scripts/gpu_scale_bench.sh`) uses it to start two replicas once, measure them, stop one and measure
the other alone, instead of starting a second deployment from nothing (a replica takes ~150 s to start and
warm up on the H200). `serve deploy` itself needs Ray's dashboard, which the GPU machine runs without.

Ready means: the application is RUNNING with REPLICAS running replicas of its deployment (a replica turns
RUNNING only after its engine's warm-up, `ray_app.TTSReplica`) and the proxy answers `/v1/audio/voices`.
"""

from __future__ import annotations

import argparse
import sys
import time
import urllib.request

import yaml


def resized(config: dict, replicas: int) -> dict:
    """The config with every deployment of its (single) application fixed at `replicas` replicas (an
    autoscaling config is dropped: a measurement wants a known count)."""
    (app,) = config["applications"]
    for deployment in app.get("deployments", []):
        deployment.pop("autoscaling_config", None)
        deployment["num_replicas"] = replicas
    return config


def running_replicas(app_name: str) -> tuple[str, dict[str, int]]:
    """The application's status and, per deployment, how many replicas are RUNNING."""
    from ray import serve

    app = serve.status().applications.get(app_name)
    if app is None:
        return "NOT_STARTED", {}
    counts = {name: int(d.replica_states.get("RUNNING", 0)) for name, d in app.deployments.items()}
    return str(app.status), counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("replicas", type=int)
    parser.add_argument("--timeout", type=float, default=420)
    args = parser.parse_args(argv)

    import ray
    from ray.serve._private.api import serve_start
    from ray.serve.config import ProxyLocation
    from ray.serve.schema import ServeDeploySchema

    with open(args.config, encoding="utf-8") as f:
        config = ServeDeploySchema.model_validate(resized(yaml.safe_load(f), args.replicas))
    ray.init(address="auto", namespace="serve", logging_level="WARNING")
    http = dict(config.http_options.model_dump())
    client = serve_start(http_options={"location": ProxyLocation._to_deployment_mode(config.proxy_location), **http})
    client.deploy_apps(config)
    (app,) = config.applications
    host, port = http.get("host", "127.0.0.1"), http.get("port", 8000)
    t0 = time.perf_counter()
    while True:
        status, counts = running_replicas(app.name)
        if status.endswith("RUNNING") and counts and all(n == args.replicas for n in counts.values()):
            try:
                urllib.request.urlopen(f"http://{host}:{port}/v1/audio/voices", timeout=3)
                break
            except OSError:
                pass
        if status.endswith("DEPLOY_FAILED"):
            print(f"deploy failed: {serve_status_message(app.name)}", flush=True)
            return 1
        if time.perf_counter() - t0 > args.timeout:
            print(f"not running {args.replicas} replica(s) after {args.timeout:.0f} s: {status} {counts}", flush=True)
            return 1
        time.sleep(2)
    print(f"{app.name}: {args.replicas} replica(s) running after {time.perf_counter() - t0:.0f} s", flush=True)
    return 0


def serve_status_message(app_name: str) -> str:
    from ray import serve

    app = serve.status().applications.get(app_name)
    return "" if app is None else app.message


if __name__ == "__main__":
    sys.exit(main())
