"""The output: the staging folder's files and the publish by rename, the manifest assembled from
the shards' results, the last steps before publishing, ``report.txt`` and ``packer verify``.
"""
