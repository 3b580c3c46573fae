"""Desired objects: pure builders from a spec (and settings) to the Kubernetes objects we apply.

- `builders`: Deployments, Services, PodMonitors, NetworkPolicies and the Jobs;
- `sglang`: the SGLang version table (how each version switches the CUDA IPC pool-handle cache on);
- `alerts`: the PrometheusRule groups (`python -m vlm_operator.desired.alerts` writes alerts/).
May import `api`. No I/O, no clock.
"""
