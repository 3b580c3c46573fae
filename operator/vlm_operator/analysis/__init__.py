"""Analysis: profiler windows in, the gate's verdict out.

- `sources/`: where windows come from (the sidecars, Prometheus), the only I/O here;
- `gate/`: the canary gate, pure;
- `handoff`: the one hand-off of a reconcile (policy built once, source chosen once, pods split once);
- `window`, `stats`, `tdist`: the window record and the statistics the gate uses;
- `profile`: what the stable pods' profiles say, for status.
May import `api` and `cluster.observed`; everything but `sources` is pure.
"""
