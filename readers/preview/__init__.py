"""Pictures of what readers return: contact sheets for ``packer preview``."""
