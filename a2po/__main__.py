import sys

from a2po.cli import main

sys.exit(main())
