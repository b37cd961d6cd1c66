import sys

if sys.argv[1:2] == ["sweep"]:  # `python -m a2po sweep ...` (a2po.sweep), which runs `train` once per grid point
    from a2po.sweep import run_sweep

    sys.exit(run_sweep(sys.argv[2:]))

from a2po.cli import main

sys.exit(main())
