"""The controller: kopf handlers and the reconcile pass (read, decide, write).

- `handlers`: every kopf handler, thin, and the indexes the snapshot is built from;
- `reconcile`: one pass for one VLMService (snapshot -> decisions -> writes, status last);
- `act`: orders the writes of a pass through `cluster.writer`.
The top layer below `__main__`: may import every package.
"""
