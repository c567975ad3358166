"""tg-conformance: the suite every tgcore device plugin must pass. Run `tg-conformance --device NAME`, or
`python -m pytest --pyargs tg_conformance --device NAME`."""

__version__ = "0.2.0"

ENV_PRIVATE_CACHE = "TG_CONFORMANCE_PRIVATE_CACHE"  # the CLI sets it to the path of the run's own compile cache
