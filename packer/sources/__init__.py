"""Finding the samples: walking a tree, pairing files into samples and labelling them, containers
(Parquet, saved Hugging Face datasets, tars), a packer output as the source of a repack, and the
discovery saved for ``--resume``.
"""
