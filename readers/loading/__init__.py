"""Loading: ``make_loader`` and ``PackedLoader``, collating batches, samplers and permutations."""
