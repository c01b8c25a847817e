"""The datasets: ``ReaderBase`` and the map-style base, one reader per format, the output's files
and identity, stored pixels to tensors, the readers' defaults.
"""
