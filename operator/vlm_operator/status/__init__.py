"""Status: pure, what a reconcile found and decided -> the VLMService status and its conditions.

- `build`: `build_status` (typed, validated) and the patch body written;
- `conditions`: condition records and their transitions.
May import `api`, `cluster.observed` and `analysis`.
"""
