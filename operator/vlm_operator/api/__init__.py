"""The API: what users and Prometheus see, and what the operator is configured with.

- `v1alpha1`: the VLMService pydantic models (spec, status, the core Kubernetes types they embed), the only
  source of the CRD's schema; `crdgen` writes the CRD from them (`python -m vlm_operator.api.crdgen`).
- `names`: every user-visible name (group, labels, annotations, ports, roles, phases, stages), defined once.
- `settings`: the operator's own configuration (`VLM_*` environment variables).
- `metrics`: the operator's own Prometheus metrics and their scrape-time collector.
- `units`, `errors`, `generated`: durations and times, the error classes, generated-file upkeep.
The bottom layer: imports no other package of the operator. Pure except `crdgen`/`generated` (files) and
`metrics` (a process-wide registry).
"""
