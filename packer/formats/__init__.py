"""The format writers and scanners, one module per format (``packer/formats/NAME.py``).

Nothing is imported here: the formats are chosen through ``packer.spec.registry``, which names each
format's writer, scanner and reader and loads only the one that is used.
"""
