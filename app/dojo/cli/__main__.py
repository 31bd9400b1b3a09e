import sys

from dojo.cli import main

sys.exit(main())
