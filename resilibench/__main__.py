"""``python -m resilibench``: the command line."""

from resilibench.cli import main

raise SystemExit(main())
