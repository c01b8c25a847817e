"""Token outputs: a corpus tokenized once (``tokenizing``) and packed into blocks (``packing``)."""
