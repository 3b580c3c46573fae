"""`python -m vlm_operator.crdgen [--check]`: the CRD generator's old entry point, kept for scripts and checks that
call it by that name; the generator lives in `vlm_operator.api.crdgen`."""

from vlm_operator.api.crdgen import main

if __name__ == "__main__":
    raise SystemExit(main())
