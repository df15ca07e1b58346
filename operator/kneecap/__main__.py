import sys

from kneecap.cli import main

sys.exit(main())
