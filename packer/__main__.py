"""``python -m packer``: the same command line as the ``packer`` script."""

from packer.cli import main

if __name__ == "__main__":
    main()
