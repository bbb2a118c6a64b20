"""``python -m AnonMRILib`` runs the ``anonmri`` command."""
import sys

from AnonMRILib.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
