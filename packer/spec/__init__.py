"""What every packer output is, and how its stored bytes read back: the sample layout, the format
registry, the manifest, codecs, field kinds, shard names, the class map and the splits record.
The readers import this part of packer (and ``packer.pixels`` to decode as the converter did).
"""
