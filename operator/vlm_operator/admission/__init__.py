"""Admission: the sidecar-injection webhook, for pods that are not a VLMService's.

- `inject`: AdmissionReview in, JSON patch out (pure);
- `certs`: the CA and serving certificate (pure);
- `webhook`: the HTTPS server and the certificate keeper (I/O through `cluster.client`).
May import `api`, `cluster` and `desired`.
"""
