"""Running an operation's shards: the staging lifecycle every operation shares (``Staging``)."""
