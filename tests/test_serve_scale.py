"""scripts/serve_scale.py: the scale bench's deploy/resize step (its Ray part was tried on a local cluster:
two tiny replicas resized to one in 4 s, the one left kept serving; the GPU run is in BENCHMARKS.md)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("serve_scale", ROOT / "scripts" / "serve_scale.py")
serve_scale = importlib.util.module_from_spec(spec)
spec.loader.exec_module(serve_scale)


def test_resized_sets_every_deployment_and_still_validates():
    from ray.serve.schema import ServeDeploySchema

    for name in ("serve.yaml", "serve_tiny_cpu.yaml"):
        config = yaml.safe_load((ROOT / "configs" / name).read_text())
        schema = ServeDeploySchema.model_validate(serve_scale.resized(config, 1))
        (app,) = schema.applications
        assert [d.num_replicas for d in app.deployments] == [1] * len(app.deployments) and app.deployments
