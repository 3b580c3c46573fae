"""The rollout: pure decisions about revisions and pods.

- `steps`: the revisions' Deployments, the step a rollout is in and its next state (verdict -> plan);
- `placement`: which pods move to which nodes within `maxUnavailable`, surging on free GPUs.
May import `api`, `cluster.observed`, `desired` and `analysis`. No I/O, no clock (`now` is passed).
"""
