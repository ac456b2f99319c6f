"""`python -m epdctl` is the same as the `epdctl` console script."""

from epdctl.cli import main

if __name__ == "__main__":
    main()
