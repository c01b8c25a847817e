"""Several outputs as one: ``concat`` and mixtures."""
