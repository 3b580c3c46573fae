"""The judge: the gate as an HTTP endpoint for Argo Rollouts and Flagger.

- `evaluate`: request in, the gate's decision out (pure);
- `server`: HTTP, authentication and authorization, the pods and their windows (I/O).
May import `api`, `cluster` and `analysis`.
"""
