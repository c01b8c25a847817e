"""The operations, each built on ``packer.run.Staging``: convert, append, combine, repack, the
splits of a set and a conversion split over several machines (nodes and merge).
"""
