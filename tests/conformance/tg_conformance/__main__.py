"""`python -m tg_conformance ...` is `tg-conformance ...`."""
import sys

from tg_conformance.cli import main

sys.exit(main())
