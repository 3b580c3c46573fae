"""The cluster: the one connection, the one client, the one writer, and the snapshot a reconcile reads.

- `connection`: credentials and HTTP to the API server (no kubernetes client library in the process);
- `client`: `KubeAPI`/`Kube`, the only code that sends requests (server-side apply, errors classified);
- `writer`: `Writer`, every write of a reconcile behind a write cache, status last;
- `observed`: `Observed`, the snapshot of a service's objects that the pure rooms read.
May import `api` only. The pure packages may import `observed` and nothing else of this package.
"""
