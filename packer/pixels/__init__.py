"""The pixels: reading source files, decoding (scaled JPEG, orientation, colour mode), the resize
rule, where each source pixel lands (geometry and boxes), ``--codec source``, statistics.
"""
