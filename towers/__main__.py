"""`python -m towers` runs the CLI."""
import sys

from towers.cli import main

sys.exit(main())
