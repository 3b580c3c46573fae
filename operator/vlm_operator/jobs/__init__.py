"""The programs the operator's Jobs run in its image: `weights` (download a model into the claim) and `loadgen`
(load during analysis). Stand-alone programs: they import no other package of the operator.
"""
